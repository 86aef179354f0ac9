"""Which new entries of /dev/shm a test made, when other programs share the machine's /dev/shm.

/dev/shm is one folder for the whole machine: a test that compares it before and after charges itself with what
any other process made meanwhile (the H100 run of 2026-11-27 ran four suites at once, and impl's CUDA IPC test was
charged 17 entries: `cuda.shm.*` and `torch_<pid>_*`). Two families of entries name the process that made them:
torch's shared-memory files (`torch_<pid>_<random>_<n>`, the CUDA IPC reference counters and the CPU tensors of the
file_system strategy) and the CUDA driver's IPC files (`cuda.shm.<device>.<pid in hex>.<n>`).

`ShmWatch` lists /dev/shm every POLL_S while the test runs and, for each new entry that names a process, looks at
that process as soon as the entry appears (it made the entry, so it is normally still alive): is it the test's
process or one of its descendants? `foreign()` returns the new entries made by a process outside the test's tree;
the audit does not charge those. Nor those that name one of the harness's own long-lived processes (`harness`: the
rank forkserver, the resource tracker), which outlive every test by design: on the H100 runs of 2026-11-27 the CUDA
IPC test (FI-GPU-1) left `cuda.shm.0.3d78.1`, pid 0x3d78 being the rank forkserver of its pytest worker. Whether the
driver names the file after the process that made it or after a pid read before a fork (docs/gpu.md), that process
is the forkserver or a rank forked from it: the harness's, not one the target started (impl's persistent worker is
spawned by the rank, its temporal worker forked from the rank). An entry whose process is gone before it was looked
at is charged (it may be the test's: a killed worker), as is every entry that names no process.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable

import psutil

__all__ = ["POLL_S", "ShmWatch", "creator_pid"]

POLL_S = 0.05
_CREATORS = (re.compile(r"^torch_(\d+)_"), re.compile(r"^cuda\.shm\.\d+\.([0-9a-f]+)\."))


def creator_pid(name: str) -> int | None:
    """The pid an entry of /dev/shm names as its maker, or None."""
    torch_match, cuda_match = (pattern.match(name) for pattern in _CREATORS)
    if torch_match:
        return int(torch_match.group(1))
    if cuda_match:
        return int(cuda_match.group(1), 16)
    return None


def _in_tree(pid: int, root: int) -> tuple[bool | None, str]:
    """Whether process `pid` is `root` or below it (None when it is gone), and what it runs."""
    try:
        process = psutil.Process(pid)
        inside = pid == root or any(parent.pid == root for parent in process.parents())
        return inside, " ".join(process.cmdline())[:120] or process.name()
    except psutil.Error:
        return None, "gone before it was looked at"


class ShmWatch:
    """Watches `folder` from start() to stop(), telling the test's new entries from other processes' ones."""

    def __init__(self, folder: str = "/dev/shm", harness: Callable[[], set[int]] = set) -> None:
        self.folder = folder
        self._harness = harness  # the pids of the harness's long-lived processes, asked at each look
        self._root = os.getpid()
        self._seen: set[str] = set()
        self._foreign: set[str] = set()
        self._makers: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, before: set[str]) -> None:
        self._seen = set(before)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="ckptspec-shm-watch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(POLL_S):
            self.look()

    def look(self) -> None:
        """Classify the entries that appeared since the last look."""
        try:
            names = set(os.listdir(self.folder))
        except OSError:
            return
        harness = self._harness() if names - self._seen else set()
        for name in names - self._seen:
            pid = creator_pid(name)
            if pid is None:
                continue
            inside, what = _in_tree(pid, self._root)
            if inside is False or pid in harness:
                self._foreign.add(name)
            else:
                self._makers[name] = f"made by pid {pid}: {what}"
        self._seen |= names

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.look()

    def foreign(self) -> set[str]:
        """New entries made by a process outside this process's tree, or named after one of the harness's."""
        return set(self._foreign)

    def maker(self, name: str) -> str | None:
        """For a charged entry that names its maker: which process that was, as first seen (or that it was gone)."""
        return self._makers.get(name)
