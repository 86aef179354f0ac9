"""AQ-11w: close(abort=True) leaves a temporal queue's in-flight call running.

AsyncCallsQueue.close documents "abort (bool, optional) - Default to False. Needs to be manually set to true when
the checkpoint async process needs to be aborted."; the weak level asks that within 30 s of close's return no
process of the aborted call is still running. In NVRx 0.7.0 and Megatron-Core 0.16.1 and 0.19.2,
AsyncCallsQueue.close(abort=True) skips finalization and aborts only the queue's persistent caller (which a
temporal queue does not have); the TemporalAsyncCaller of the in-flight call, whose own close(abort=True) would kill
its forked child, is never closed, so the child goes on running (and writing) after close returned.

    python AQ-11w.py nvidia_resiliency_ext | megatron.core | impl
"""

import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common

core = _common.module("async_ckpt.core")
GONE_S = 30  # the clause's bound: the call's process has ended this long after close(abort=True) returned
WRITE_S = GONE_S + 15  # the call runs this long unless it is ended
TIMEOUT_S = 60 + GONE_S + 10  # close's bound (60 s), then the wait for the call's process


def _write(pid_file: str) -> None:
    Path(pid_file).write_text(str(os.getpid()))
    time.sleep(WRITE_S)


def _running(pid: int) -> bool:
    """The process exists and is not a zombie (exited, not yet reaped: allowed by the clause)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def _body(rank: int, world: int, tmp: str) -> dict:
    pid_file, committed = os.path.join(tmp, "pid"), []
    queue = core.AsyncCallsQueue(persistent=False)
    queue.schedule_async_request(core.AsyncRequest(_write, (pid_file,), [lambda: committed.append(True)]))
    deadline = time.monotonic() + 20
    while not (os.path.exists(pid_file) and Path(pid_file).read_text()) and time.monotonic() < deadline:
        time.sleep(0.05)
    child = int(Path(pid_file).read_text())
    start = time.monotonic()
    try:
        queue.close(abort=True)
        closed = "returned" if time.monotonic() - start <= 60 else "returned after more than 60 s"
    except Exception as exc:  # catches all: reported as what close did
        closed = f"raised {type(exc).__name__}: {exc}"
    deadline = time.monotonic() + GONE_S
    while _running(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    running = _running(child)
    if running:
        os.kill(child, signal.SIGKILL)  # the call this reproducer started
    return {
        "close(abort=True)": closed,
        "finalize function ran": bool(committed),
        f"call's process running {GONE_S} s after close": running,
    }


def main() -> None:
    with _common.scratch() as tmp:
        how, value = _common.run_ranks(_body, tmp, world=1, timeout_s=TIMEOUT_S)[0]
    if how == "hung":
        _common.verdict(
            True, f"close(abort=True) with a call in flight: the rank was still running after {TIMEOUT_S} s"
        )
    if how == "raised":
        _common.setup_failed({0: (how, value)})
    expected = {"close(abort=True)": "returned", "finalize function ran": False}
    expected |= {f"call's process running {GONE_S} s after close": False}
    _common.verdict(value != expected, f"close(abort=True) with a call in flight: {value} (expected {expected})")


if __name__ == "__main__":
    main()
