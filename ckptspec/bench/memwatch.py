"""Peak host memory of this process tree, sampled from a process of its own.

    watcher = TreeWatcher(interval_s=0.1)   # starts sampling this process and its descendants
    ...
    peak = watcher.stop()                   # the largest sample (bytes), the watcher itself left out

A sample is `ckptspec.bench.memory.tree_pss` (Pss_Anon + Pss_Shmem over the tree, shared pages counted once).
It is taken in another process, `python -m ckptspec.bench.memwatch PID INTERVAL_S`, which samples until its
stdin closes and then prints the peak: a sampling thread in the trainer would take the GIL each time a torch
op releases it, and the trainer would wait up to the interpreter's switch interval for it after every op
(a 5 ms training step took 400 ms that way). Each sample costs the watcher a few ms of CPU time.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from ckptspec.bench.memory import tree_pss

__all__ = ["TreeWatcher"]

STOP_BOUND_S = 60.0


class TreeWatcher:
    """Samples the tree of this process from a child process until `stop()`."""

    def __init__(self, interval_s: float = 0.1):
        self._process = subprocess.Popen(
            [sys.executable, "-m", "ckptspec.bench.memwatch", str(os.getpid()), str(interval_s)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=Path(__file__).resolve().parents[2],  # where `ckptspec` is importable
        )

    def stop(self) -> int:
        """Stop sampling; the peak over the samples taken (bytes)."""
        out, _ = self._process.communicate(timeout=STOP_BOUND_S)
        if self._process.returncode != 0:
            raise RuntimeError(f"memory watcher exited with {self._process.returncode}")
        return int(out)


def _watch(root: int, interval_s: float) -> int:
    """Sample the tree of `root` every `interval_s` until stdin closes; the peak."""
    peak, closed = 0, threading.Event()

    def wait_for_eof() -> None:
        sys.stdin.read()
        closed.set()

    threading.Thread(target=wait_for_eof, daemon=True).start()
    while True:
        peak = max(peak, tree_pss(root, exclude=os.getpid()))
        if closed.wait(interval_s):
            return max(peak, tree_pss(root, exclude=os.getpid()))


if __name__ == "__main__":
    print(_watch(int(sys.argv[1]), float(sys.argv[2])))
