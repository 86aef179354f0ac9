"""AQ-4: a finalize function runs before the request's async_fn has finished on every rank (temporal caller).

AsyncRequest documents finalize_fns as "functions to call to finalize the request. These functions will be called
synchronously after async_fn is done on all ranks." In NVRx 0.4.1 and 0.7.0 and Megatron-Core 0.16.1 and 0.19.2,
TemporalAsyncCaller.is_current_async_call_done(blocking=True) all-reduces its own child's "alive" flag first, then
(because blocking is set) only joins its own child and returns True, whatever the other ranks answered. Rank 0,
whose call is quick, therefore runs the finalize functions (the commit) while rank 1's call is still writing. Rank
1's call here ends as soon as rank 0 has finalized, or after 5 s, so the outcome does not depend on timing.

    python AQ-4.py nvidia_resiliency_ext | megatron.core | impl
"""

import functools
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common

core = _common.module("async_ckpt.core")
RANK1_MAX_S = 5.0  # rank 1's call runs until rank 0 has finalized, or this long


def _write(done_marker: str, wait_for: str | None) -> None:
    deadline = time.monotonic() + RANK1_MAX_S
    while wait_for is not None and not os.path.exists(wait_for) and time.monotonic() < deadline:
        time.sleep(0.01)
    Path(done_marker).touch()


def _finalize(tmp: str, rank: int, seen: list) -> None:
    seen.append(sorted(f for f in os.listdir(tmp) if f.startswith("done")))
    Path(tmp, f"finalized{rank}").touch()


def _body(rank: int, world: int, tmp: str) -> list:
    seen = []
    queue = core.AsyncCallsQueue(persistent=False)
    args = (os.path.join(tmp, f"done{rank}"), os.path.join(tmp, "finalized0") if rank == 1 else None)
    queue.schedule_async_request(core.AsyncRequest(_write, args, [functools.partial(_finalize, tmp, rank, seen)]))
    queue.maybe_finalize_async_calls(blocking=True)
    queue.close()
    return seen


def main() -> None:
    with _common.scratch() as tmp:
        results = _common.run_ranks(_body, tmp, timeout_s=30)
    if any(how != "returned" for how, _ in results.values()):
        _common.setup_failed(results)
    seen = {rank: value for rank, (_, value) in results.items()}
    _common.verdict(
        any(value != [["done0", "done1"]] for value in seen.values()),
        f"async_fn calls finished when each rank's finalize function ran: {seen} (every rank should see both "
        f"done0 and done1; rank 1's call ends once rank 0 has finalized, or after {RANK1_MAX_S} s)",
    )


if __name__ == "__main__":
    main()
