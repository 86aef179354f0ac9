"""SIGTERM to a trainer at a chosen point: how a scheduler preempts it, mid-save or between saves.

`terminated(tmp, name, fn, *args, log=LOG)` forks fn(*args) in a process with its own session and a world-1
process group (as crash_points.in_child does); fn installs a faultfs plan writing `log` whose fault is a "hang".
Once the log shows that point reached (the save is held there, mid-flight), the parent sends the child SIGTERM, and
waits for it to end. With `ready=PATH` in place of `log`, the point is reached once fn has created the file PATH
(the trainer between saves, where the test wants the signal). Once the child ended, whatever is left of its session
is SIGKILLed and the child reaped, so no worker it started outlives the test. Every wait is bounded: the point must
be reached within REACH seconds, the child end within TERM_BOUND seconds of the SIGTERM (else it is SIGKILLed, and
the outcome says so).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch.distributed as dist

from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.harness import remove

__all__ = ["REACH", "TERM_BOUND", "Terminated", "terminated"]

REACH = 60.0
"""Seconds for the child to reach the held point (a first save imports and starts the library's machinery)."""
TERM_BOUND = 30.0
"""Seconds for the child to end after SIGTERM."""


@dataclass(frozen=True)
class Terminated:
    """What became of the child: whether the held point was reached, how it ended, and in how long."""

    reached: bool
    ended_by: str  # "SIGTERM", "exit <code>", "SIGKILL after the bound", or "signal <n>"
    seconds: float


def _child(tmp: str, name: str, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    code = 1
    try:
        os.setsid()
        store = dist.FileStore(os.path.join(tmp, f"{name}.store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        fn(*args)
        code = 0
    finally:
        os._exit(code)


def _held(log: str | None, ready: str | None) -> bool:
    """Whether the child reached the point: its hang fired in `log`, or it created the file `ready`."""
    if ready is not None:
        return os.path.exists(ready)
    return log is not None and os.path.exists(log) and bool(faultfs.fired(log, "hang"))


def _ending(status: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        return "SIGTERM" if sig == signal.SIGTERM else f"signal {sig}"
    return f"exit {os.WEXITSTATUS(status)}"


def _wait(pid: int, until: float) -> int | None:
    """The child's wait status once it ended before `until` (it is reaped), else None."""
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return status
        if time.monotonic() >= until:
            return None
        time.sleep(0.01)


def terminated(
    tmp: str, name: str, fn: Callable[..., Any], *args: Any, log: str | None = None, ready: str | None = None
) -> Terminated:
    """Run fn(*args) in a forked child; SIGTERM it once `log` shows its hang reached, or once it created the file
    `ready` (exactly one of the two; see the module docstring)."""
    if (log is None) == (ready is None):
        raise ValueError("terminated() takes exactly one of log= and ready=")
    pid = os.fork()
    if pid == 0:
        _child(tmp, name, fn, args)
    status: int | None = None
    try:
        deadline = time.monotonic() + REACH
        while not _held(log, ready) and time.monotonic() < deadline:
            status = _wait(pid, 0.0)
            if status is not None:
                return Terminated(False, _ending(status), 0.0)  # it ended without reaching the point
            time.sleep(0.01)
        reached, start = _held(log, ready), time.monotonic()
        os.kill(pid, signal.SIGTERM)
        status = _wait(pid, start + TERM_BOUND)
        ended_by = "SIGKILL after the bound" if status is None else _ending(status)
        return Terminated(reached, ended_by, time.monotonic() - start)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # the child's session: the child, if still there, and what it started
        if status is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        remove(os.path.join(tmp, f"{name}.store"))
