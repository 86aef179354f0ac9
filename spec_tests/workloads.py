"""Module-level (hence picklable) async functions that tests put into AsyncRequests.

They run in whatever process the target chooses (trainer, forked child, persistent worker), so they
only touch files: a gate file lets a test decide when an async call may finish.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import torch

__all__ = ["GATE_TIMEOUT", "PickleGate", "append_line", "fail", "gated", "open_gate", "save_when_open", "write_pid"]

GATE_TIMEOUT = 120.0


def open_gate(gate: str) -> None:
    Path(gate).touch()


def _wait_for(gate: str) -> None:
    deadline = time.monotonic() + GATE_TIMEOUT
    while not os.path.exists(gate):
        if time.monotonic() > deadline:
            raise TimeoutError(f"gate {gate} was never opened")
        time.sleep(0.005)


def gated(gate: str | None, fail_with: str | None = None) -> None:
    """Wait for the gate (if any), then raise RuntimeError(fail_with) if given."""
    if gate is not None:
        _wait_for(gate)
    if fail_with is not None:
        raise RuntimeError(fail_with)


def fail(message: str) -> None:
    raise RuntimeError(message)


def save_when_open(gate: str | None, obj, path: str) -> None:
    """torch.save(obj, path) once the gate is open: the trainer mutates obj meanwhile."""
    if gate is not None:
        _wait_for(gate)
    torch.save(obj, path)


def append_line(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text + "\n")


def write_pid(path: str, gate: str | None = None) -> None:
    """Record the pid of the process running the async call (then wait for the gate)."""
    Path(path).write_text(str(os.getpid()))
    if gate is not None:
        _wait_for(gate)


class PickleGate:
    """A state-dict value whose pickling waits for a gate, except in the process that created it.

    Put first in a state dict given to torch.save, it holds the writer (worker or child) until the
    test opens the gate, so "the trainer mutates while the write is in flight" happens every time.
    """

    def __init__(self, gate: str, creator: int | None = None):
        self.gate, self.creator = gate, os.getpid() if creator is None else creator

    def __reduce__(self):
        if os.getpid() != self.creator:
            _wait_for(self.gate)
        return (PickleGate, (self.gate, self.creator))

    def __eq__(self, other):
        return isinstance(other, PickleGate) and other.gate == self.gate

