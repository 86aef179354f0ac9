"""The manager layer: the code above the save that decides which checkpoint a job resumes from and which it deletes.

Implemented by each target's adapter (`checkpoint_manager(root, keep)`, capability "manager"), so the `MG-*` clauses
(ckptspec/spec/clauses/manager.toml) judge torchtitan's CheckpointManager, Lightning's ModelCheckpoint and impl's
reference manager alike:

    manager = checkpoint_manager(root, keep=k)   a CheckpointManager keeping its checkpoints below `root`,
                                                  retaining the k newest (0: all)
    manager.save(step, state)    start saving `state` as the checkpoint of `step` (steps strictly increase); may
                                 return before it is durable; collective
    manager.wait()               returns once every save started is durable and committed; raises if a save failed
                                 on any rank; collective (retention may go on in the background until close())
    manager.latest()             the step resume would load now (None: none), read from storage alone
    manager.resume(template)     (step, state) of the checkpoint resume loads, with the keys and tensor shapes of
                                 `template`; None when there is none; raises where the library refuses to load
    manager.load(step, template) the state of `step`'s checkpoint, shaped as `template`; raises if it does not load
    manager.location(step)       the file or directory that holds `step`'s checkpoint (what a test may damage)
    manager.copies(step)         every file or directory holding a copy of `step`'s checkpoint (default: location)
    manager.steps()              the steps whose checkpoints are on storage now, committed or not, ascending
    manager.pointer              the path of the file naming the latest checkpoint, or None where resume scans
    manager.close()              waits for what is in flight (saves, retention), then ends every thread the manager
                                 started
    manager.retention_order(o)   optional: where the manager's retention of a save races with that save's writer
                                 creating the new checkpoint's location, force the order `o` for the saves that
                                 follow (RETENTION_ORDERS); False (the default): nothing races, nothing forced
    manager.enable_save_on_sigterm()  capability "manager_sigterm_save": turn on the library's save on SIGTERM as its
                                 documentation tells a user to; called once, on a new manager, before its first save
    manager.advance(step, state) the training loop finished `step` (no save due at it) and its state is now `state`:
                                 what the library's loop runs at a step runs; True when the manager asks the loop to
                                 stop (it saved on SIGTERM, the trainer is to end); False (the default): go on

latest() and resume() are called on a new manager over the same root (as a restarted job makes one): they must
not rely on anything the saving manager kept in memory. Bounds are the caller's (asserts.bounded).
"""

from __future__ import annotations

import abc
from typing import Any

from ckptspec.spec.harness.surface.loading import MissingCapability, Target, current_target

__all__ = ["RETENTION_ORDERS", "CheckpointManager", "checkpoint_manager"]

# The two orders of a race between retention and the writer of the save in flight: retention lists the checkpoints
# before the new checkpoint's location exists, or after.
RETENTION_ORDERS = ("retention-first", "location-first")


class CheckpointManager(abc.ABC):
    """What a trainer keeps to save, retain and resume checkpoints (see the module docstring)."""

    pointer: str | None = None
    """The pointer (tracker) file, where the manager publishes one; None where resume scans the checkpoints."""

    @abc.abstractmethod
    def save(self, step: int, state_dict: dict[str, Any]) -> None:
        """Start saving `state_dict` as the checkpoint of `step`; collective over the default process group."""

    @abc.abstractmethod
    def wait(self) -> None:
        """Return once every save started is durable and committed; raise if one failed on any rank."""

    @abc.abstractmethod
    def latest(self) -> int | None:
        """The step resume would load from storage now, or None."""

    @abc.abstractmethod
    def resume(self, template: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        """Load the checkpoint resume chooses into a state dict shaped as `template`: (step, state), or None."""

    @abc.abstractmethod
    def load(self, step: int, template: dict[str, Any]) -> dict[str, Any]:
        """The state of the checkpoint of `step`, shaped as `template`; raises if there is none or it is damaged."""

    @abc.abstractmethod
    def location(self, step: int) -> str:
        """The file or directory holding the checkpoint of `step`."""

    def copies(self, step: int) -> list[str]:
        """Every file or directory holding a copy of the checkpoint of `step` (a `last` copy besides its own)."""
        return [self.location(step)]

    @abc.abstractmethod
    def steps(self) -> list[int]:
        """The steps whose checkpoints are on storage now (committed or not), ascending."""

    @abc.abstractmethod
    def close(self) -> None:
        """Wait for saves in flight, then end every thread this manager started."""

    def retention_order(self, order: str) -> bool:
        """For the saves that follow, make retention list the checkpoints before ("retention-first") or after
        ("location-first") the save's writer creates the new checkpoint's location, where the two race in this
        manager (retention run by save() while the write goes on in the background); True when the order is forced,
        False (the default) where they never race, so there is nothing to force."""
        if order not in RETENTION_ORDERS:
            raise ValueError(f"unknown retention order {order!r}; one of {', '.join(RETENTION_ORDERS)}")
        return False

    def enable_save_on_sigterm(self) -> None:
        """With capability `manager_sigterm_save`: turn on the library's save on SIGTERM, set as its documentation
        tells a user to; called once, on a new manager, before its first save() or advance(). From then on a SIGTERM
        to this process makes the manager save, as a checkpoint that resume() loads, the state of the step the
        training loop had reached at the signal (its last advance()) or of a later one, and then end the trainer:
        advance() returns True, or the process ends by itself. The default raises MissingCapability."""
        raise MissingCapability(f"{type(self).__name__} offers no save on SIGTERM (capability manager_sigterm_save)")

    def advance(self, step: int, state_dict: dict[str, Any]) -> bool:
        """The training loop finished `step` (steps strictly increase, past every saved one) with no save due at it,
        and its state is now `state_dict`: run what the library's training loop runs around a step, as its loop
        does. True when the manager asks the loop to stop (it saved on SIGTERM; the trainer is to end); the default,
        for a manager that nothing happens to between saves, returns False."""
        return False


def checkpoint_manager(root: str, keep: int = 0, target: Target | None = None) -> CheckpointManager:
    """A new CheckpointManager of `target` (the current one by default) over `root`, retaining `keep` checkpoints
    (0: all); MissingCapability if its adapter has none."""
    target = target or current_target()
    make = getattr(target.adapter, "checkpoint_manager", None)
    if make is None or not target.has("manager"):
        raise MissingCapability(f"target {target.name!r} has no manager adapter")
    manager: CheckpointManager = make(root, keep)
    return manager
