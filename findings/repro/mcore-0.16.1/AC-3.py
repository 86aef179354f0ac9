"""AC-3: maybe_finalize_async_calls(no_dist=True) still issues a collective.

AsyncCallsQueue.maybe_finalize_async_calls documents "no_dist (bool, Optional) - if True, training ranks simply
check its asynchronous checkpoint writer without synchronization." In Megatron-Core 0.16.1 and 0.19.2 the caller
honours no_dist, but maybe_finalize_async_calls itself, after running each finalized call's finalize functions,
all-reduces the call index (to check that every rank finalizes the same call) whatever no_dist is. A rank that
finalizes with no_dist=True while the others do not finalize then waits in that all-reduce.

    python AC-3.py nvidia_resiliency_ext | megatron.core | impl
"""

import sys
from pathlib import Path

import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common

core = _common.module("async_ckpt.core")
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_object",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "reduce",
    "gather",
    "gather_object",
    "scatter",
    "all_to_all",
    "reduce_scatter",
)


def _count_collectives(calls: list) -> None:
    """Replace torch.distributed's collectives (in this rank only) by wrappers that log each call."""
    for name in COLLECTIVES:
        real = getattr(dist, name, None)
        if real is not None:
            setattr(dist, name, lambda *a, _real=real, _name=name, **k: calls.append(_name) or _real(*a, **k))


def _body(rank: int, world: int) -> list:
    queue = core.AsyncCallsQueue(persistent=False)
    queue.schedule_async_request(core.AsyncRequest(print, (f"rank {rank}: async_fn ran",), []))
    calls = []
    _count_collectives(calls)
    finalized = queue.maybe_finalize_async_calls(blocking=True, no_dist=True)
    return [finalized, calls]


def main() -> None:
    results = _common.run_ranks(_body, timeout_s=30)
    if any(how != "returned" for how, _ in results.values()):
        _common.setup_failed(results)
    calls = {rank: value[1] for rank, (_, value) in results.items()}
    finalized = {rank: value[0] for rank, (_, value) in results.items()}
    if finalized != {0: [0], 1: [0]}:
        _common.setup_failed(results)
    _common.verdict(
        any(calls.values()),
        f"collectives issued per rank by maybe_finalize_async_calls(blocking=True, no_dist=True): {calls} "
        "(should be none)",
    )


if __name__ == "__main__":
    main()
