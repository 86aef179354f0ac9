"""Ending what the harness's ranks started, wherever it went, and whatever outlives a pytest session.

A rank is the leader of its own session and process group, and stopping it with killpg ends what stayed in that group. A
process that left the group (a worker that called setsid) or was re-parented after its rank exited escapes that:

- every rank exports `MARK` = its run's work directory, which the programs it starts inherit; `kill_marked` ends
  every process whose environment carries a value, wherever it went (a forked child that never exec'd shows its
  parent's original environment instead, and is found as a descendant by `kill_tree` while its rank lives);
- every pytest-xdist worker exports `WORKER_MARK` = run and worker id before it starts anything, so that when a
  worker crashes (killed by the OOM killer, say) the controller ends what it started, which nobody else would;
- `kill_tree(pid)` ends every descendant of pid;
- `kill_descendants(keep)` ends what still runs below this process when a session ends;
- `children()` and `kill_new_children(before)` end what a test started in this process and left running;
- `collect_garbage(bound)` lets what a body dropped release what it holds, within a bound.

Each returns a line per process it ended, for the caller to report.
"""

from __future__ import annotations

import gc
import os
import threading
from collections.abc import Collection, Iterable

import psutil

__all__ = [
    "MARK",
    "WORKER_MARK",
    "children",
    "collect_garbage",
    "harness_pids",
    "kill_descendants",
    "kill_marked",
    "kill_new_children",
    "kill_tree",
]

MARK = "CKPTSPEC_RANK_RUN"
WORKER_MARK = "CKPTSPEC_XDIST_WORKER"
_WAIT = 5.0  # seconds to collect what was SIGKILLed


def harness_pids() -> set[int]:
    """This process's long-lived multiprocessing helpers, which end by themselves: forkserver, resource tracker."""
    from multiprocessing import forkserver, resource_tracker

    server = getattr(forkserver._forkserver, "_forkserver_pid", None)
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    return {pid for pid in (server, tracker) if pid}


def _kill(procs: list[psutil.Process]) -> list[str]:
    ended = []
    for proc in procs:
        try:
            line = f"pid {proc.pid}: {' '.join(proc.cmdline())[:160] or proc.name()}"
            proc.kill()
            ended.append(line)
        except psutil.Error:
            continue
    psutil.wait_procs(procs, timeout=_WAIT)
    return ended


def kill_marked(value: str, variable: str = MARK, keep: Collection[int] = ()) -> list[str]:
    """SIGKILL every other process whose environment has `variable`=value, but the pids in `keep`."""
    me, found = os.getpid(), []
    for proc in psutil.process_iter():
        try:
            if proc.pid != me and proc.pid not in keep and proc.environ().get(variable) == value:
                found.append(proc)
        except psutil.Error:
            continue
    return _kill(found)


def kill_tree(pid: int) -> list[str]:
    """SIGKILL every descendant of pid (not pid itself)."""
    try:
        return _kill(psutil.Process(pid).children(recursive=True))
    except psutil.Error:
        return []


def kill_descendants(keep: Iterable[int] = ()) -> list[str]:
    """SIGKILL every descendant of this process but those in `keep` (and their own descendants)."""
    keep = set(keep)
    spared = set(keep)
    for pid in keep:
        try:
            spared |= {p.pid for p in psutil.Process(pid).children(recursive=True)}
        except psutil.Error:
            continue
    return _kill([p for p in psutil.Process().children(recursive=True) if p.pid not in spared])


def children() -> set[tuple[int, float]]:
    """(pid, start time) of this process's live children, its multiprocessing helpers excepted."""
    harness, found = harness_pids(), set()
    for proc in psutil.Process().children():
        try:
            if proc.pid not in harness and proc.status() != psutil.STATUS_ZOMBIE:
                found.add((proc.pid, proc.create_time()))
        except psutil.Error:
            continue
    return found


def kill_new_children(before: set[tuple[int, float]]) -> list[str]:
    """SIGKILL the children of this process (and their descendants) that `children()` did not list `before`."""
    new = [pid for pid, _ in children() - before]
    procs = []
    for pid in new:
        try:
            proc = psutil.Process(pid)
            procs += [*proc.children(recursive=True), proc]
        except psutil.Error:
            continue
    return _kill(procs)


def collect_garbage(bound: float, *, unfreeze: bool = False) -> bool:
    """gc.collect() in a daemon thread, waited for at most `bound` seconds; True if it finished.

    So that objects a body dropped release what they hold (weakref finalizers of writers and queues) before the
    process goes on or is stopped; a finalizer that blocks (a queue whose __del__ waits for a dead worker) is left
    behind in its thread instead of hanging the caller. `unfreeze`: first return what gc.freeze() set aside.
    """
    if unfreeze:
        gc.unfreeze()
    collector = threading.Thread(target=gc.collect, name="ckptspec-gc", daemon=True)
    collector.start()
    collector.join(bound)
    return not collector.is_alive()
