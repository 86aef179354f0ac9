"""The orphan audit: what a test leaves behind in processes, shared memory and temporary files.

`Audit.start()` before a test and `Audit.leftovers()` after it. Three kinds of leftovers:

- processes: descendants of this process that did not exist before the test. This process is made
  a child subreaper (Linux prctl), so a process orphaned anywhere below it (a worker whose trainer
  was killed) is re-parented here instead of to init, and stays visible. Orphaned zombies are reaped.
  Not counted: the harness's own long-lived processes (multiprocessing's forkserver and resource
  tracker, and the rank processes a warm RankPool keeps between tests).
- shared memory: entries of /dev/shm that appeared during the test. Not counted: `sem.mp-*`
  (multiprocessing semaphores, unlinked by the resource tracker of the process that created them;
  the harness stops rank processes with their whole process group, tracker included), and entries
  that name a process outside this test's tree as their maker (ckptspec/faults/shm_watch.py: another
  program on the machine made them) or one of the harness's long-lived processes above (the CUDA driver's file of a
  rank forked from the forkserver carries the forkserver's pid).
- temporary files: anything left in the test's private TMPDIR (each rank runs with its own
  subdirectory as TMPDIR, see ckptspec.spec.drivers.faults.tmpdirs.on_ranks), also by processes the test SIGKILLs
  on purpose: a killed trainer cannot remove a temporary file, so a target must keep none outside its
  checkpoint. Not counted: `pymp-*` (multiprocessing's per-process directory, removed when that
  process exits normally, which a rank stopped by the runner or killed does not) and `torchinductor_*` (torch's
  per-user compile cache, made by importing `torch._inductor`, as Lightning's import does, and kept on purpose
  across runs: no file of a save).

Leftovers get a bounded grace period to disappear (processes exit asynchronously after close()),
then the test fails with a list, and leftover processes are killed by pid so later tests start clean.
"""

from __future__ import annotations

import contextlib
import ctypes
import multiprocessing
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field

import psutil

from ckptspec.faults.shm_watch import ShmWatch
from ckptspec.spec.harness.ranks.reaper import harness_pids

__all__ = ["GRACE", "Audit"]

GRACE = 10.0  # the bound PC-4 gives a worker to exit after its trainer is gone
_PR_SET_CHILD_SUBREAPER = 36
_SHM = "/dev/shm"


_NOT_COUNTED = ("pymp-", "torchinductor_")  # see the module docstring: not files of a save


def _become_subreaper() -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_CHILD_SUBREAPER) failed")


def _owned_children() -> set[int]:
    """Direct children that some object here will wait for (never reap those behind its back)."""
    owned = {p.pid for p in multiprocessing.active_children() if p.pid is not None} | harness_pids()
    owned |= {p.pid for p in getattr(subprocess, "_active", None) or []}
    return owned


def _reap_orphans() -> None:
    """Collect the exit status of zombies re-parented here (nobody else will)."""
    owned = _owned_children()
    for child in psutil.Process().children():
        try:
            if child.pid not in owned and child.status() == psutil.STATUS_ZOMBIE:
                os.waitpid(child.pid, os.WNOHANG)
        except (psutil.Error, ChildProcessError):
            continue


def _made_by(maker: str | None) -> str:
    return f" ({maker})" if maker else ""


def _describe(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())[:160] or proc.name()
        return f"pid {proc.pid} (parent {proc.ppid()}): {cmd}"
    except psutil.Error:
        return f"pid {proc.pid} (gone)"


@dataclass
class Audit:
    """One test's audit. tmpdir: the test's private TMPDIR (None: not checked)."""

    tmpdir: str | None = None
    grace: float = GRACE
    _before: set = field(default_factory=set)
    _shm_before: set = field(default_factory=set)
    _shm_watch: ShmWatch = field(default_factory=ShmWatch)

    def start(self) -> None:
        _become_subreaper()
        _reap_orphans()
        self._before = {(p.pid, p.create_time()) for p in self._processes()}
        self._shm_before = set(os.listdir(_SHM)) if os.path.isdir(_SHM) else set()
        if os.path.isdir(_SHM):
            self._shm_watch = ShmWatch(_SHM, harness=harness_pids)
            self._shm_watch.start(self._shm_before)

    def _processes(self) -> list[psutil.Process]:
        """Live descendants, without the harness's long-lived helpers."""
        harness = harness_pids()
        result = []
        for proc in psutil.Process().children(recursive=True):
            try:
                if proc.status() == psutil.STATUS_ZOMBIE or proc.pid in harness:
                    continue
                if proc.ppid() in harness:
                    continue  # the forkserver's children are rank processes, stopped by the runner
                result.append(proc)
            except psutil.Error:
                continue
        return result

    def _new_processes(self) -> list[psutil.Process]:
        found = []
        for proc in self._processes():
            try:
                if (proc.pid, proc.create_time()) not in self._before:
                    found.append(proc)
            except psutil.Error:
                continue
        return found

    def _new_shm(self) -> list[str]:
        if not os.path.isdir(_SHM):
            return []
        new = set(os.listdir(_SHM)) - self._shm_before - self._shm_watch.foreign()
        return sorted(n for n in new if not n.startswith("sem.mp-"))

    def _tmp_leftovers(self) -> list[str]:
        """Entries of the private TMPDIRs (the test TMPDIR's subdirectories) and stray top-level files."""
        if self.tmpdir is None or not os.path.isdir(self.tmpdir):
            return []
        found = []
        for entry in sorted(os.listdir(self.tmpdir)):
            path = os.path.join(self.tmpdir, entry)
            if entry.startswith(_NOT_COUNTED):
                continue
            if os.path.isdir(path):
                found += [os.path.join(entry, n) for n in sorted(os.listdir(path)) if not n.startswith(_NOT_COUNTED)]
            else:
                found.append(entry)
        return found

    def leftovers(self) -> list[str]:
        """What the test left behind, after the grace period; leftover processes are killed."""
        deadline = time.monotonic() + self.grace
        while True:
            _reap_orphans()
            procs, shm, tmp = self._new_processes(), self._new_shm(), self._tmp_leftovers()
            if not (procs or shm or tmp) or time.monotonic() >= deadline:
                break
            time.sleep(0.05)
        self._shm_watch.stop()
        shm = self._new_shm()  # with the watch's last look
        found = [f"process {_describe(p)}" for p in procs]
        found += [f"shared memory {_SHM}/{name}" + _made_by(self._shm_watch.maker(name)) for name in shm]
        if tmp:
            assert self.tmpdir is not None  # leftovers are only looked for in a tmpdir
            found += [f"temporary file {os.path.join(self.tmpdir, name)}" for name in tmp]
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGKILL)  # only processes that appeared during this test
        _reap_orphans()
        return found
