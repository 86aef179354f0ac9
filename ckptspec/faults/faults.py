"""What the fault tests share beyond the fault machinery: the storage errors of the matrix, and process control.

The fault machinery itself (the file-system layer, the phases of a save and the steps that place a fault in one,
crash points, rank runs under the audit) is the drivers layer's, ckptspec.spec.drivers.faults, which the spec areas
use too; the time bounds are ckptspec.spec.drivers.bounds. What a call did (returned, raised, or hung past BOUND) is
ckptspec.spec.harness's `outcome_of`; closing a queue after a provoked fault, its `close_quietly`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from ckptspec.spec.harness import alive, workloads

__all__ = [
    "ERRNOS",
    "STORAGE_FAULTS",
    "exits_within",
    "kill_pids",
    "kill_self_when",
    "wait_for_pids",
]

ERRNOS = ("ENOSPC", "EACCES", "EIO")
STORAGE_FAULTS: dict[tuple[str, str], tuple[int | str, dict[str, Any]]] = {
    ("plan", "ENOSPC"): ("all", {"op": "mkdir"}),
    ("plan", "EACCES"): ("all", {"op": "mkdir"}),
    ("plan", "EIO"): ("all", {"op": "mkdir"}),
    ("write", "ENOSPC"): (1, {"limit": 64, "name": "*.distcp"}),
    ("write", "EACCES"): (1, {"op": "open", "name": "*.distcp"}),
    ("write", "EIO"): (1, {"op": "write", "nth": 2, "name": "*.distcp"}),
    ("finalize", "ENOSPC"): (0, {"limit": 16, "name": ".metadata*"}),
    ("finalize", "EACCES"): (0, {"op": "open", "name": ".metadata*"}),
    ("finalize", "EIO"): (0, {"op": "write", "name": ".metadata*"}),
}
"""(phase, errno) -> (the ranks it hits, the faultfs.Fault fields that place it in that phase of a DCP save): the
checkpoint directory's mkdir on every rank, rank 1's data files, or the coordinator's metadata."""

# ------------------------------------------------------------------------------ process control


def kill_self_when(path: str, seconds: float = workloads.GATE_TIMEOUT) -> None:
    """SIGKILL this process as soon as `path` exists (watched by a daemon thread)."""

    def watch():
        deadline = time.monotonic() + seconds
        while not os.path.exists(path):
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="kill-self-when", daemon=True).start()


def exits_within(pids, seconds: float) -> list[int]:
    """Wait up to `seconds` for every pid to exit; return those still running."""
    deadline = time.monotonic() + seconds
    running = [p for p in pids if alive(p)]
    while running and time.monotonic() < deadline:
        time.sleep(0.02)
        running = [p for p in running if alive(p)]
    return running


def wait_for_pids(path: str, count: int = 1, seconds: float = 60) -> list[int]:
    """Pids recorded in marker file `path` (one per line) once there are `count` of them."""
    deadline = time.monotonic() + seconds
    while True:
        lines = Path(path).read_text().split() if os.path.exists(path) else []
        if len(lines) >= count:
            return [int(x) for x in lines]
        assert time.monotonic() < deadline, f"{path} did not list {count} pid(s) within {seconds:g}s"
        time.sleep(0.01)


def kill_pids(pids) -> None:
    """SIGKILL the given pids (processes this test started or caused); missing ones are ignored."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
