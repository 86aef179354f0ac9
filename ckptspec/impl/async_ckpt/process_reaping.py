"""Ending what a caller started: its process group signalled, killed within a grace, and live callers aborted at exit.

A caller's child or worker leads its own process group, so signalling the group also reaches what it started.
`track_live` registers a caller whose worker or child is running; `abort_live_callers` closes them (abort=True)
when this process exits.
"""

from __future__ import annotations

import contextlib
import os
import signal
import weakref
from multiprocessing import util as mp_util
from multiprocessing.process import BaseProcess
from typing import Protocol

__all__ = ["abort_live_callers", "kill_group", "signal_group", "track_live", "untrack_live"]

_ABORT_GRACE_S = 5.0  # SIGTERM -> SIGKILL delay when aborting a worker


class Closable(Protocol):
    def close(self, abort: bool = False) -> None: ...


def signal_group(process: BaseProcess, sig: int) -> None:
    """Signal the process group led by ``process``, or the process alone if there is none yet."""
    assert process.pid is not None  # only called with a started process
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        # No group: the child has not called setpgid yet, or the whole group is gone.
        # Only signal the pid while it is unreaped, so it cannot belong to someone else.
        if process.exitcode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(process.pid, sig)


def kill_group(process: BaseProcess) -> None:
    """SIGTERM the process and its group, wait up to the grace period, then SIGKILL. Bounded."""
    signal_group(process, signal.SIGTERM)
    process.join(_ABORT_GRACE_S)
    signal_group(process, signal.SIGKILL)
    process.join()


# Callers with a live worker or child, aborted when this process exits. multiprocessing's exit
# function joins non-daemonic children, which would wait forever on an idle persistent worker.
# It runs exit finalizers (exitpriority >= 0) before that join, both at interpreter exit and at
# the end of processes started by multiprocessing (e.g. torch.multiprocessing.spawn ranks),
# where plain atexit hooks would come too late or never run. Processes started by multiprocessing
# clear the finalizer registry they inherit, and a forked child must never abort its parent's
# workers: so the set and its hook belong to one pid and are made afresh in each process.
_LIVE_CALLERS: weakref.WeakSet[Closable] = weakref.WeakSet()
_LIVE_CALLERS_PID: int | None = None


def track_live(caller: Closable) -> None:
    global _LIVE_CALLERS, _LIVE_CALLERS_PID
    if os.getpid() != _LIVE_CALLERS_PID:
        _LIVE_CALLERS, _LIVE_CALLERS_PID = weakref.WeakSet(), os.getpid()
        mp_util.Finalize(None, abort_live_callers, exitpriority=10)
    _LIVE_CALLERS.add(caller)


def untrack_live(caller: Closable) -> None:
    _LIVE_CALLERS.discard(caller)


def abort_live_callers() -> None:
    if os.getpid() == _LIVE_CALLERS_PID:
        for caller in list(_LIVE_CALLERS):
            caller.close(abort=True)
