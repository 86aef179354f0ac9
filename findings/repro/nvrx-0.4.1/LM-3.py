"""LM-3: an async local save with replication, scheduled on the persistent queue, never finalizes.

Shown on NVRx 0.4.1 and 0.7.0. 001 (local checkpointing): save(..., is_async=True) returns an AsyncRequest to be
scheduled with AsyncCallsQueue.schedule_async_request, and the guide's own usage creates the queue with its
default, the persistent caller.

With a replication strategy, the request's async_fn is a bound method of the LocalCheckpointManager, whose
replication strategy holds process groups. The persistent caller pickles each request for its worker process: the
pickling fails in the queue's feeder thread (TypeError), the request never reaches the worker, and
maybe_finalize_async_calls(blocking=True) waits for a completion that never comes. Without replication, or with
the temporal caller (fork, no pickling), the same save finalizes. 2 gloo ranks, replication jump 1, factor 2.

    python LM-3.py nvidia_resiliency_ext | impl
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common  # noqa: E402
import torch  # noqa: E402

BOUND_S = 60


def _body(rank: int, world: int, tmp: str) -> str:
    core = _common.module("async_ckpt.core")
    strategies = _common.module("local.replication.strategies")
    local = _common.module("local.ckpt_managers.local_manager")
    _common.cpu_replica_transfers()
    manager = local.LocalCheckpointManager(
        os.path.join(tmp, f"node{rank}"),
        repl_strategy=strategies.CliqueReplicationStrategy.from_replication_params(1, 2),
    )
    state = _common.CpuStateDict({"w": torch.full((4,), float(rank)), "step": 1})
    request = manager.save(state, 1, is_async=True)
    queue = core.AsyncCallsQueue(persistent=True)
    queue.schedule_async_request(request)
    finalized = _common.outcome(BOUND_S, queue.maybe_finalize_async_calls, True)
    _common.linger(tmp, rank, world, BOUND_S)
    return f"{finalized}; find_latest() {manager.find_latest() if finalized == 'returned' else 'not asked'}"


def main() -> None:
    with _common.scratch() as tmp:
        results = _common.run_ranks(_body, tmp, timeout_s=3 * BOUND_S)
    if any(how != "returned" for how, _ in results.values()):
        _common.setup_failed(results)
    answers = {rank: value for rank, (_, value) in results.items()}
    for rank, answer in answers.items():
        print(
            f"rank {rank}: blocking finalize of save(..., is_async=True) on AsyncCallsQueue(persistent=True): {answer}"
        )
    _common.verdict(
        any(not answer.startswith("returned; find_latest() 1") for answer in answers.values()),
        "the replicated async save should finalize within the bound and be found as iteration 1 on every rank",
    )


if __name__ == "__main__":
    main()
