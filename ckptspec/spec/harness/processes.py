"""The processes async calls run in: the target's async core and its two callers, observing processes and files
from outside (Linux /proc), and ending what a test started."""

from __future__ import annotations

import os
import shutil
import time
from types import ModuleType
from typing import Any

import pytest

from ckptspec.spec.harness.asserts import attempt
from ckptspec.spec.harness.surface.loading import current_target

__all__ = [
    "CALLERS",
    "CALLER_CLASSES",
    "STARTUP_BOUND",
    "alive",
    "async_core",
    "close_quietly",
    "exists",
    "remove",
    "wait_for_file",
]

CALLERS = [
    pytest.param(True, id="persistent", marks=pytest.mark.needs("persistent_caller")),
    pytest.param(False, id="temporal", marks=pytest.mark.needs("temporal_caller")),
]
"""Parameters `persistent` of a test run once per caller: a persistent worker, or a temporal child per call."""

CALLER_CLASSES = [
    pytest.param("PersistentAsyncCaller", marks=pytest.mark.needs("persistent_caller")),
    pytest.param("TemporalAsyncCaller", marks=pytest.mark.needs("temporal_caller")),
]
"""Parameters `caller_name` of a test run once per caller class, by its public name."""


def async_core() -> ModuleType:
    """The target's async_ckpt.core module, in whatever process asks (a rank body): the `core` fixture's twin."""
    return current_target().module("async_ckpt.core")


def alive(pid: int) -> bool:
    """True while pid runs (a zombie, exited but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def exists(pid: int) -> bool:
    """True while pid has a process-table entry: running, or exited but not reaped by its parent."""
    return os.path.exists(f"/proc/{pid}")


STARTUP_BOUND = 120.0
"""Seconds to wait for what a test starts but does not judge (a worker spawned, a call begun): generous, since a
spawned interpreter importing torch took over 30 s on a 2-core runner at a load of 10 (a run on 2026-11-26)."""


def wait_for_file(path: str, seconds: float = STARTUP_BOUND) -> str:
    """The contents of path once it exists and is non-empty; fails after `seconds` (by default STARTUP_BOUND: the
    file is written by something the test started, and when it starts is not the subject)."""
    deadline = time.monotonic() + seconds
    while not (os.path.exists(path) and os.path.getsize(path)):
        assert time.monotonic() < deadline, f"{path} was not written within {seconds:g}s"
        time.sleep(0.01)
    with open(path) as f:
        return f.read()


def remove(*paths: str) -> None:
    """Remove each path, a file or a whole directory; a path that does not exist is fine."""
    for path in paths:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.remove(path)


def close_quietly(queue: Any, *, abort: bool = False, bound: float = 30) -> None:
    """Close a queue after a provoked fault, within `bound` seconds; how that ends is not the test's subject.

    A queue whose close does not return (or a target without close(abort=True)) is left to the runner, which
    stops the rank.
    """
    if abort:
        attempt(queue.close, abort=True, bound=bound, what="close(abort=True)")
    else:
        attempt(queue.close, bound=bound, what="close()")
