"""Observing processes and files that async calls leave behind (Linux /proc)."""

from __future__ import annotations

import os
import time

__all__ = ["alive", "exists", "wait_for_file"]


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


def wait_for_file(path: str, seconds: float = 30) -> str:
    """The contents of path once it exists and is non-empty; fails after `seconds`."""
    deadline = time.monotonic() + seconds
    while not (os.path.exists(path) and os.path.getsize(path)):
        assert time.monotonic() < deadline, f"{path} was not written within {seconds:g}s"
        time.sleep(0.01)
    with open(path) as f:
        return f.read()
