"""What the protocol tests share: each rank's state dict, bounded calls of the protocol interface, reading back.

Each rank saves its own keys (`rank_state(rank, version)`), so a checkpoint is complete only with every rank's
data; `assert_loads` reads it back with stock dcp.load in this process, no process group (P-LOAD-1).
"""

from __future__ import annotations

import contextlib
import os

import torch

from spec_tests.drivers.saving import load, template
from spec_tests.harness.asserts import assert_state_dict_equal, attempt, bounded
from spec_tests.harness.protocol import SaveHandle, Saver, protocol_saver
from spec_tests.harness.ranks import world

__all__ = [
    "BOUND",
    "EXIT_BOUND",
    "WARM_BOUND",
    "committed",
    "data_file",
    "expected",
    "rank_state",
    "release",
    "save",
    "save_outcome",
    "start",
    "wait",
    "warm_saver",
]

BOUND = 30.0
"""Seconds for a wait, an error or a save's completion (as PC-5 and AQ-7)."""
EXIT_BOUND = 10.0
"""Seconds for processes to be gone (as PC-4 and AQ-11)."""
WARM_BOUND = 120.0
"""Seconds for a saver's first save, which starts its workers (spawning a process that imports torch can take
tens of seconds on a loaded machine); the clauses' bounds apply to the saves after it."""


def rank_state(rank: int, version: int, numel: int = 12) -> dict:
    """What rank `rank` saves as checkpoint `version`: its own keys, a tensor and a plain value."""
    weight = torch.arange(numel, dtype=torch.float32) + 1000 * version + rank
    return {f"r{rank}": {"w": weight, "step": version}}


def expected(world_size: int, version: int, numel: int = 12) -> dict:
    """The whole checkpoint `version`: every rank's state dict."""
    whole: dict = {}
    for rank in range(world_size):
        whole.update(rank_state(rank, version, numel))
    return whole


def start(saver: Saver, state_dict: dict, path: str) -> SaveHandle:
    return bounded(BOUND, "start()", saver.start, state_dict, path)


def wait(handle: SaveHandle, bound: float = BOUND):
    return bounded(bound, "wait()", handle.wait)


def save(state_dict: dict, path: str, saver: Saver | None = None, bound: float = BOUND) -> None:
    """One complete save (start, wait, each within `bound`) with a saver of its own unless one is given, which it
    closes; a new saver's first save gets WARM_BOUND (it starts the saver's workers)."""
    own = saver is None
    saver = saver or protocol_saver()
    bound = max(bound, WARM_BOUND) if own else bound
    try:
        wait(bounded(bound, "start()", saver.start, state_dict, path), bound)
    finally:
        if own:
            bounded(bound, "close()", saver.close)


def warm_saver(path: str, **options) -> Saver:
    """A new saver that has completed one save, to `path` + ".warm", as a trainer's has; collective."""

    saver = protocol_saver(**options)
    handle = bounded(WARM_BOUND, "the first start()", saver.start, rank_state(world()[0], 0), path + ".warm")
    bounded(WARM_BOUND, "the first wait()", handle.wait)
    return saver


def committed(path: str) -> bool:
    return os.path.exists(os.path.join(path, ".metadata"))


def assert_loads(path: str, want: dict, call: str = "") -> None:
    """The checkpoint at `path` loads with stock dcp.load (no process group) to exactly `want` (P-LOAD-1)."""
    assert_state_dict_equal(load(want, path), want, call=call or f"torch.distributed.checkpoint.load of {path}")


__all__ += ["assert_loads", "template"]


def in_group(pgid: int) -> list[int]:
    """The live processes of process group (or session) `pgid`, from /proc: what a trainer leader started."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z" and pgid in (int(fields[2]), int(fields[3])):
                found.append(int(entry))
    return found


__all__ += ["in_group"]


def data_file(path: str, rank: int) -> str:
    """The first data file of `rank` in DCP's file-system layout (torch's FileSystemWriter, NVRx, Megatron-Core)."""
    return os.path.join(path, f"__{rank}_0.distcp")


def save_outcome(path):
    """What a whole save (start, then wait) of a warm saver did on this rank, within BOUND."""
    rank, _ = world()
    saver = warm_saver(path)
    outcome = attempt(lambda: start(saver, rank_state(rank, 1), path).wait(), bound=BOUND, what="start() and wait()")
    attempt(saver.close, bound=BOUND, what="close()")
    return outcome


def release(fifo: str) -> None:
    """Let a writer blocked opening `fifo` go on (it then writes into a pipe nobody reads: EPIPE)."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
