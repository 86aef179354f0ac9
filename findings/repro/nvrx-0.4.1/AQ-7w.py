"""AQ-7w: the rank whose async_fn failed finalizes the call as a success (temporal caller).

Weak level of AQ-7, implied by AsyncCallsQueue.maybe_finalize_async_calls ("CheckpointException - if any rank(s)
raised an exception during checkpoint writing, the exceptions are wrapped and raised on all ranks"): at the least
the failing rank's blocking finalize must raise (within 90 s) without running the call's finalize functions. In
NVRx 0.4.1 and 0.7.0 and Megatron-Core 0.16.1 and 0.19.2 the temporal caller runs async_fn in a forked child and
only ever checks is_alive() and join()s it; the child's exit code is never read, so on rank 1, whose async_fn
raised, the blocking finalize returns normally and runs the finalize functions (the commit). (With the persistent
caller the worker dies of the exception instead and the failing rank's blocking finalize waits for good.)

    python AQ-7w.py nvidia_resiliency_ext | megatron.core | impl
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common

core = _common.module("async_ckpt.core")
BOUND_S = 90  # the clause's bound on the failing rank's blocking finalize


def _write(rank: int) -> None:
    if rank == 1:
        raise OSError("disk full (injected)")


def _body(rank: int, world: int) -> str:
    committed = []
    queue = core.AsyncCallsQueue(persistent=False)
    queue.schedule_async_request(core.AsyncRequest(_write, (rank,), [lambda: committed.append(True)]))
    try:
        queue.maybe_finalize_async_calls(blocking=True)
        outcome = "returned"
    except BaseException as exc:  # catches all: any exception (CheckpointException is a BaseException)
        outcome = f"raised {type(exc).__name__}"
    return outcome + (", finalize function ran" if committed else "")


def main() -> None:
    results = _common.run_ranks(_body, timeout_s=BOUND_S + 5)
    seen = {rank: value if how == "returned" else how for rank, (how, value) in results.items()}
    if "raised" in seen.values():
        _common.setup_failed(results)
    failing_ok = seen[1].startswith("raised") and "finalize function ran" not in seen[1]
    mixed = any(v.startswith("returned") for v in seen.values()) and not all(
        v.startswith("returned") for v in seen.values()
    )
    _common.verdict(
        not failing_ok or mixed,
        f"blocking finalize per rank after rank 1's async_fn raised OSError: {seen} (rank 1 should raise without "
        "running the finalize function, and no rank should return while another raises or hangs)",
    )


if __name__ == "__main__":
    main()
