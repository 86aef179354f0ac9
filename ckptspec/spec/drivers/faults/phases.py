"""The phases of a save, and the step that places a fault in one.

A fault is placed in a *phase* of a save by a `Step`, run at the start of that phase in whatever process runs it (the
trainer for plan and finalize, the worker for staging and write): it may record its pid in a marker file, SIGKILL its
own process, wait for a gate file, and install a fault-layer plan (`faultfs`) for the rest of the phase. `Hooks`
holds one Step per phase; `in_phase` is the picklable form a request's functions are wrapped in.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.harness import workloads

__all__ = ["NOTHING", "PHASES", "SAVE_PHASES", "Hooks", "Step", "in_phase"]

PHASES = ("plan", "staging", "write", "finalize", "exchange", "committed")
"""Phases of a save, in order; the fault matrix has one column per phase."""
SAVE_PHASES = PHASES[:4]
"""The phases of one running save, in order (one rank has no replica exchange; "committed" is after the save)."""


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

    def run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
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


def in_phase(step: Step, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Module-level (picklable) form of step.run, for functools.partial in AsyncRequests."""
    return step.run(fn, *args, **kwargs)


def _write_atomically(path: str, text: str) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    Path(tmp).write_text(text)
    os.replace(tmp, path)
