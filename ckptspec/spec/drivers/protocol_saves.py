"""What the protocol tests share: each rank's state dict, bounded calls of the protocol interface, reading back.

Each rank saves its own keys (`rank_state(rank, version)`), so a checkpoint is complete only with every rank's
data; what a rank saves, `committed` and `assert_loads` are ckptspec.spec.drivers.states', here for the target's
format (torch DCP's unless the adapter names its own), which `data_file` asks too.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import pytest

from ckptspec.spec.drivers.bounds import BOUND, EXIT_BOUND, WARM_BOUND
from ckptspec.spec.drivers.saving import template
from ckptspec.spec.drivers.states import assert_loads, committed, load, rank_state, whole_state
from ckptspec.spec.harness.asserts import Outcome, attempt, bounded
from ckptspec.spec.harness.ranks import world
from ckptspec.spec.harness.surface.loading import checkpoint_format
from ckptspec.spec.harness.surface.saver_api import SaveHandle, Saver, protocol_saver

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


expected = whole_state
"""The whole checkpoint `version` of `world_size` ranks (ckptspec.spec.drivers.states.whole_state)."""


def start(saver: Saver, state_dict: dict[str, Any], path: str) -> SaveHandle:
    return bounded(BOUND, "start()", saver.start, state_dict, path)


def wait(handle: SaveHandle, bound: float = BOUND) -> Any:
    return bounded(bound, "wait()", handle.wait)


def save(state_dict: dict[str, Any], path: str, saver: Saver | None = None, bound: float = BOUND) -> None:
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


def warm_saver(path: str, **options: Any) -> Saver:
    """A new saver that has completed one save, to `path` + ".warm", as a trainer's has; collective."""

    saver = protocol_saver(**options)
    handle = bounded(WARM_BOUND, "the first start()", saver.start, rank_state(world()[0], 0), path + ".warm")
    bounded(WARM_BOUND, "the first wait()", handle.wait)
    return saver


def loader() -> str:
    """The target's loader as messages name it ("dcp.load" for DCP's format)."""
    return checkpoint_format().loader


__all__ += ["assert_loads", "load", "loader", "template"]


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
    """The (first) data file of `rank` in the target's format (DCP's: `__<rank>_0.distcp`)."""
    return checkpoint_format().data_file(path, rank)


def fifo_data_file(path: str) -> str:
    """Rank 0's data file in the (existing, empty) location `path`, for a test that makes it a FIFO before the save
    (a write that hangs). Skips where the format puts that file in a folder of the location the save makes itself
    (OLMo-core's `model_and_optim/`): a location holding anything is refused before any write (a
    FileExistsError), so no write can be made to hang this way."""
    fifo = data_file(path, 0)
    if os.path.dirname(fifo) != os.path.normpath(path):
        pytest.skip(
            f"not judged here: this target's data files lie in a folder its save makes ({os.path.relpath(fifo, path)})"
            ", so a hanging data file cannot be planted in the location before the save"
        )
    return fifo


def save_outcome(path: str, version: int = 1) -> Outcome:
    """What a whole save (start, then wait) of checkpoint `version` by a warm saver did on this rank, within BOUND."""
    rank, _ = world()
    saver = warm_saver(path)
    state = rank_state(rank, version)
    outcome = attempt(lambda: start(saver, state, path).wait(), bound=BOUND, what="start() and wait()")
    attempt(saver.close, bound=BOUND, what="close()")
    return outcome


def release(fifo: str) -> None:
    """Let a writer blocked opening `fifo` go on (it then writes into a pipe nobody reads: EPIPE)."""
    with contextlib.suppress(OSError):
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
