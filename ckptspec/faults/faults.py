"""What the fault tests share: bounds, rank runs under the audit, phase steps, self-kill, cleanup.

What a call did (returned, raised, or hung past BOUND) is ckptspec.spec.harness's `outcome_of`; closing a queue
after a provoked fault, its `close_quietly`.

A fault is placed in a *phase* of a save by a `Step`, run at the start of that phase in whatever
process runs it (the trainer for plan and finalize, the worker for staging and write): it may record
its pid in a marker file, SIGKILL its own process, wait for a gate file, and install a fault-layer
plan (ckptspec.faults.faultfs) for the rest of the phase. `Hooks` holds one Step per phase.
"""

from __future__ import annotations

import contextlib
import os
import signal
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptspec.faults import faultfs
from ckptspec.spec.harness import alive, run_on_ranks, workloads
from ckptspec.spec.harness.ranks.reaper import collect_garbage

__all__ = [
    "BOUND",
    "ERRNOS",
    "EXIT_BOUND",
    "PHASES",
    "SAVE_PHASES",
    "STORAGE_FAULTS",
    "Hooks",
    "Step",
    "exits_within",
    "in_phase",
    "kill_pids",
    "kill_self_when",
    "on_ranks",
    "wait_for_pids",
]

BOUND = 30.0
"""Seconds within which a fault must surface as an error on every rank (as PC-5 and AQ-7)."""
EXIT_BOUND = 10.0
"""Seconds within which processes must be gone after abort or trainer death (as AQ-11 and PC-4)."""
PHASES = ("plan", "staging", "write", "finalize", "exchange", "committed")
SAVE_PHASES = PHASES[:4]
"""The phases of one running save, in order (one rank has no replica exchange; "committed" is after the save)."""
"""Phases of a save, in order; the fault matrix has one column per phase."""

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

current_tmpdir: str | None = None
"""The running test's private TMPDIR, set by the audit fixture (ckptspec/faults/conftest.py)."""


# --------------------------------------------------------------------------------------- ranks


def on_ranks(world_size: int, fn, *args, timeout: float = 120, expect_exit=None, backend="auto") -> list:
    """run_on_ranks(fn, ...) on fresh ranks, each with its own TMPDIR inside the test's private one.

    The audit inspects every rank's TMPDIR, also of ranks killed on purpose (expect_exit): a target
    may keep no temporary file outside its checkpoint that a killed trainer could not remove. Tests that
    kill a rank pass backend="gloo" (see clause FI-GPU-2); the others run over NCCL where there is a GPU per rank.
    """
    __tracebackhide__ = True
    return run_on_ranks(
        _in_test_env, world_size, (current_tmpdir, fn, *args), timeout=timeout, expect_exit=expect_exit, backend=backend
    )


def audited_tmpdir() -> str | None:
    """The running test's private TMPDIR, which the orphan audit inspects; None where no audit runs."""
    return os.environ.get("CKPTSPEC_FI_TMPDIR") or current_tmpdir


def private_tmpdir(name: str, base: str | None = None) -> None:
    """Point this process's TMPDIR (and its children's) at `name` inside `base`, by default the test's audited
    TMPDIR; never directly in the machine's temporary directory, where nothing would remove it."""
    root = base or audited_tmpdir()
    if root is None:
        raise ValueError(f"private_tmpdir({name!r}): no audited TMPDIR and no base directory")
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    os.environ["TMPDIR"] = path
    tempfile.tempdir = None  # recomputed from TMPDIR on next use


def _in_test_env(tmpdir, fn, *args):
    if tmpdir is not None:
        os.environ["CKPTSPEC_FI_TMPDIR"] = tmpdir
        private_tmpdir(f"rank{os.environ['RANK']}")
    try:
        return fn(*args)
    finally:
        # The runner stops a rank right after its reply, before interpreter exit would collect what the body dropped.
        collect_garbage(EXIT_BOUND)


# -------------------------------------------------------------------------------------- phases


@dataclass(frozen=True)
class Step:
    """What happens at the start of one phase (see the module docstring); picklable."""

    marker: str | None = None
    die: bool = False
    gate: str | None = None
    fs: faultfs.Plan | None = None

    def enter(self) -> None:
        if self.marker is not None:
            _write_atomically(self.marker, str(os.getpid()))
        if self.die:
            os.kill(os.getpid(), signal.SIGKILL)
        if self.gate is not None:
            workloads.gated(self.gate)

    def run(self, fn, *args, **kwargs):
        """enter(), then fn(*args, **kwargs) under the step's fault-layer plan."""
        self.enter()
        with faultfs.installed(self.fs):
            return fn(*args, **kwargs)


NOTHING = Step()


@dataclass(frozen=True)
class Hooks:
    """One Step per phase of a save (the default does nothing)."""

    plan: Step = NOTHING
    staging: Step = NOTHING
    write: Step = NOTHING
    finalize: Step = NOTHING
    exchange: Step = NOTHING

    @classmethod
    def at(cls, phase: str, step: Step) -> Hooks:
        if phase not in PHASES:
            raise ValueError(f"unknown phase {phase!r}; one of {', '.join(PHASES)}")
        return cls(**{phase: step})


def in_phase(step: Step, fn, *args, **kwargs):
    """Module-level (picklable) form of step.run, for functools.partial in AsyncRequests."""
    return step.run(fn, *args, **kwargs)


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    Path(tmp).write_text(text)
    os.replace(tmp, path)


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
