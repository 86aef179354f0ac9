"""What the manager tests share: each step's state dict, bounded calls of the manager contract, reading back.

Each rank saves its own keys (`step_state(step, rank)`), so a checkpoint is whole only with every rank's data. A
checkpoint is read back by a new manager over the same root (as a restarted job does): `resumed` and `loaded` make
one, call resume() or load(), close it, and return what they read, or the exception's one-line text.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from torch.distributed.checkpoint import CheckpointException

from ckptspec.spec.drivers.bounds import BOUND, WARM_BOUND
from ckptspec.spec.drivers.states import rank_state, whole_state
from ckptspec.spec.harness.asserts import assert_state_dict_equal, attempt, bounded
from ckptspec.spec.harness.ranks import world
from ckptspec.spec.harness.surface.manager_api import CheckpointManager, checkpoint_manager

__all__ = [
    "BOUND",
    "WARM_BOUND",
    "assert_step",
    "expected",
    "files_below",
    "loaded",
    "managed",
    "resumed",
    "save_steps",
    "step_state",
]


def step_state(step: int, rank: int = 0, numel: int = 8) -> dict[str, Any]:
    """What rank `rank` saves at `step`: its state at version `step` (ckptspec.spec.drivers.states)."""
    return rank_state(rank, step, numel)


def expected(step: int, world_size: int = 1) -> dict[str, Any]:
    """The whole checkpoint of `step`: every rank's state dict."""
    return whole_state(world_size, step, numel=8)


@contextlib.contextmanager
def managed(root: str, keep: int = 0, failed: bool = False) -> Iterator[CheckpointManager]:
    """A new manager over `root`, closed (within WARM_BOUND) when the block ends. `failed`: a save in the block was
    made to fail, so close() may report that failure again; it is then still bounded, but what it raises is not
    this block's concern (the test judges the failed save itself)."""
    manager = checkpoint_manager(root, keep)
    try:
        yield manager
    finally:
        if failed:
            attempt(manager.close, bound=WARM_BOUND, what="close()")
        else:
            bounded(WARM_BOUND, "close()", manager.close)


def save_steps(manager: CheckpointManager, steps: list[int], bound: float = WARM_BOUND) -> None:
    """save(step) then wait() for each step, this rank's state of each, each call within `bound`."""
    rank, _ = world()
    for step in steps:
        bounded(bound, f"save({step})", manager.save, step, step_state(step, rank))
        bounded(bound, f"wait() after save({step})", manager.wait)


def _text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"


def resumed(root: str, world_size: int = 1, keep: int = 0) -> tuple[int, dict[str, Any]] | str | None:
    """What a new manager's resume() returns (step, state) or None, or the text of what it raised."""
    try:
        with managed(root, keep) as manager:
            return bounded(WARM_BOUND, "resume()", manager.resume, expected(0, world_size))
    except (Exception, CheckpointException) as exc:  # torch's CheckpointException is a BaseException
        return _text(exc)


def loaded(root: str, step: int, world_size: int = 1, keep: int = 0) -> dict[str, Any] | str:
    """What a new manager's load(step) returns, or the text of what it raised."""
    try:
        with managed(root, keep) as manager:
            return bounded(WARM_BOUND, f"load({step})", manager.load, step, expected(0, world_size))
    except (Exception, CheckpointException) as exc:  # torch's CheckpointException is a BaseException
        return _text(exc)


def assert_step(result: Any, step: int, world_size: int = 1, what: str = "resume()") -> None:
    """`result` (of resumed) is the checkpoint of `step`, exactly."""
    assert isinstance(result, tuple), f"{what} should load step {step}, but returned {result!r}"
    got, state = result
    assert got == step, f"{what} loaded step {got}, but the newest committed checkpoint is step {step}"
    assert_state_dict_equal(state, expected(step, world_size), call=f"{what} of step {step}")


def files_below(path: str) -> list[str]:
    """Every file below `path` (a file or a directory), for damaging a checkpoint."""
    if os.path.isfile(path):
        return [path]
    return sorted(os.path.join(d, f) for d, _, names in os.walk(path) for f in names)
