"""Module-level (hence picklable) async functions that tests put into AsyncRequests.

They run in whatever process the target chooses (trainer, forked child, persistent worker), so they
only touch files: a gate file lets a test decide when an async call may finish.
"""

from __future__ import annotations

import functools
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import torch

__all__ = [
    "GATE_TIMEOUT",
    "PickleFails",
    "PickleGate",
    "append_line",
    "call_when_open",
    "fail",
    "failing_on_rank1",
    "gated",
    "leave_thread_running",
    "open_gate",
    "save_when_open",
    "write_pid",
]

T = TypeVar("T")

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


def save_when_open(gate: str | None, obj: object, path: str) -> None:
    """torch.save(obj, path) once the gate is open: the trainer mutates obj meanwhile."""
    if gate is not None:
        _wait_for(gate)
    torch.save(obj, path)


def call_when_open(gate: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """fn(*args, **kwargs) once the gate is open (e.g. a storage writer's save function held back)."""
    _wait_for(gate)
    return fn(*args, **kwargs)


def append_line(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text + "\n")


def failing_on_rank1(core: ModuleType, rank: int, log: str, where: str) -> Any:
    """An AsyncRequest whose async_fn (`where` "async_fn") or finalize function ("finalize_fn") fails on rank 1;
    every finalize function that runs appends "fin" to `log`."""
    message = f"injected failure on rank {rank}" if rank == 1 else None
    record = functools.partial(append_line, log, "fin")
    if where == "async_fn":
        return core.AsyncRequest(gated, (None, message), [record])
    return core.AsyncRequest(gated, (None, None), [functools.partial(fail, message) if message else record])


def leave_thread_running(path: str, gate: str) -> None:
    """Record the pid of the process running the async call and return, leaving a non-daemonic thread that
    waits for the gate (at most GATE_TIMEOUT): the process cannot end before the gate opens."""
    Path(path).write_text(str(os.getpid()))
    threading.Thread(target=_wait_for, args=(gate,), name="left-running", daemon=False).start()


def write_pid(path: str, gate: str | None = None) -> None:
    """Record the pid of the process running the async call (then wait for the gate)."""
    Path(path).write_text(str(os.getpid()))
    if gate is not None:
        _wait_for(gate)


def write_pid_holding(path: str, gate: str, tensor: torch.Tensor) -> None:
    """write_pid for a request that also carries a tensor (which a persistent caller stages in shared memory)."""
    write_pid(path, gate)


def held_call(core: ModuleType, tmp: str, log: str | None = None) -> Any:
    """An AsyncRequest whose process writes its pid to tmp/pid, then waits for a gate nobody opens; its one
    finalize function appends "fin" to `log` (none without a log)."""
    finalize = [functools.partial(append_line, log, "fin")] if log else []
    return core.AsyncRequest(write_pid, (os.path.join(tmp, "pid"), os.path.join(tmp, "never-opened")), finalize)


class PickleGate:
    """A state-dict value whose pickling waits for a gate, except in the process that created it.

    Put first in a state dict given to torch.save, it holds the writer (worker or child) until the
    test opens the gate, so "the trainer mutates while the write is in flight" happens every time.
    With `reached` (a directory), a writer that gets to the gate first creates a file there named by
    its pid, so the test can wait until every writer is held.
    """

    def __init__(self, gate: str, creator: int | None = None, reached: str | None = None):
        self.gate, self.creator, self.reached = gate, os.getpid() if creator is None else creator, reached

    def __reduce__(self) -> tuple[type[PickleGate], tuple[str, int, str | None]]:
        if os.getpid() != self.creator:
            if self.reached is not None:
                Path(self.reached, str(os.getpid())).touch()
            _wait_for(self.gate)
        return (PickleGate, (self.gate, self.creator, self.reached))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PickleGate) and other.gate == self.gate


class PickleFails:
    """A state-dict value that cannot be pickled outside the process that created it.

    In a state dict saved in the background (forked child, worker), it makes that write fail with
    RuntimeError(message) while everything in the trainer (copies, collectives) still works.
    """

    def __init__(self, message: str, creator: int | None = None):
        self.message, self.creator = message, os.getpid() if creator is None else creator

    def __reduce__(self) -> tuple[type[PickleFails], tuple[str, int]]:
        if os.getpid() != self.creator:
            raise RuntimeError(self.message)
        return (PickleFails, (self.message, self.creator))
