"""AQ-7: an async_fn that fails on one rank is finalized as a success (temporal caller).

AsyncCallsQueue.maybe_finalize_async_calls documents: "CheckpointException - if any rank(s) raised an exception
during checkpoint writing, the exceptions are wrapped and raised on all ranks." With the temporal caller
(AsyncCallsQueue(persistent=False)) of NVRx 0.4.1 and 0.7.0 and Megatron-Core 0.16.1 and 0.19.2 the forked child's
exit code is never read (TemporalAsyncCaller only checks is_alive() and join()s it): rank 1's async_fn raises, yet
the blocking finalize returns on both ranks and the finalize function (the commit) runs.

    python AQ-7.py nvidia_resiliency_ext | megatron.core | impl
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common
from torch.distributed.checkpoint import CheckpointException


def _write(rank: int) -> None:
    if rank == 1:
        raise OSError("disk full (injected)")


def _body(rank: int, world: int) -> str:
    core = _common.module("async_ckpt.core")
    queue = core.AsyncCallsQueue(persistent=False)
    committed = []
    queue.schedule_async_request(core.AsyncRequest(_write, (rank,), [lambda: committed.append(True)]))
    try:
        queue.maybe_finalize_async_calls(blocking=True)
    except CheckpointException:
        return "CheckpointException"
    except Exception as exc:  # catches all: the type is what is judged
        return f"{type(exc).__name__} (not a CheckpointException)"
    return "returned normally" + (", finalize function ran" if committed else "")


def main() -> None:
    results = _common.run_ranks(_body, timeout_s=60)
    if any(how != "returned" for how, _ in results.values()):
        _common.verdict(True, f"blocking finalize with rank 1's async_fn failed: {results}")
    answers = {rank: value for rank, (_, value) in results.items()}
    _common.verdict(
        answers != {0: "CheckpointException", 1: "CheckpointException"},
        f"blocking finalize after rank 1's async_fn raised OSError: {answers} (should raise CheckpointException "
        "on every rank)",
    )


if __name__ == "__main__":
    main()
