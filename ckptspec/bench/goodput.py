"""The goodput loop: train, save every `interval` steps through a peer, and time what the trainer sees.

    loop = run(trainer, peer, steps, interval, new_path)   # the timed loop; peer None: no checkpointing
    wrong = verify(loop, peer.family, trainer)             # afterwards: {step: names} of the saves that differ

One iteration is `trainer.step(peer.before_update)` (a peer that stages in the background is waited for
before the optimizer step, as its contract asks; that wait is timed on its own too, `update_wait_s`, and the
first after a save is the save's wait before the next state change) and then `peer.poll()`, the non-blocking finalize a
training loop calls every step; its time is the step's time. After step s, for s a multiple of `interval` below `steps`, the
loop saves: it first finishes the previous save if that is still in flight (`peer.wait()`), then
fingerprints the state (not timed), then calls `peer.save`. The stall of a save is that wait plus the call.
At most one save is in flight, as torchtitan runs `dcp.async_save`: it bounds host memory to one checkpoint
and makes a save interval shorter than a save's own duration show up as stall. After the last step the loop
waits for the last save (a run is over when its checkpoints are); the last save has a whole interval to
finish first. A save is done at the first poll (or wait) that no longer finds it in flight; a synchronous
peer's save is done when its call returns.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from time import perf_counter

from ckptspec.bench.peer_api import Peer
from ckptspec.bench.training import Trainer, load, mismatches

__all__ = ["Loop", "Save", "run", "save_steps", "verify"]


@dataclass
class Save:
    """One save of a run: after which step, where, and the trainer's view of it (seconds)."""

    step: int
    path: str
    wait_s: float  # finishing the previous save first
    call_s: float  # peer.save
    durable_s: float | None = None  # from the call to the poll or wait that found it finalized
    update_wait_s: float | None = None  # the next step's peer.before_update: until the state may change
    fingerprint: dict = field(default_factory=dict, repr=False)

    @property
    def stall_s(self) -> float:
        return self.wait_s + self.call_s


@dataclass
class Loop:
    """What a run measured: each step's time, whether a save was in flight when it started, the saves."""

    step_s: list[float] = field(default_factory=list)
    in_flight: list[bool] = field(default_factory=list)
    update_wait_s: list[float] = field(default_factory=list)  # each step's peer.before_update, part of its time
    saves: list[Save] = field(default_factory=list)
    final_wait_s: float = 0.0
    wall_s: float = 0.0  # steps, stalls and the final wait; the fingerprints are left out


def save_steps(steps: int, interval: int) -> list[int]:
    """The steps after which a run of `steps` steps saves every `interval` steps."""
    return list(range(interval, steps, interval))


def run(trainer: Trainer, peer: Peer | None, steps: int, interval: int, new_path: Callable[[], str]) -> Loop:
    """Train `steps` steps, saving through `peer` after each of `save_steps(steps, interval)`."""
    saving = set(save_steps(steps, interval)) if peer is not None else set()
    peer = peer or Peer()
    loop, untimed = Loop(), 0.0
    since: float | None = None  # when the save in flight was called
    start = perf_counter()
    waited = [0.0]

    def before_update() -> None:
        begin = perf_counter()
        peer.before_update()
        waited[0] = perf_counter() - begin

    for s in range(1, steps + 1):
        begin = perf_counter()
        loop.in_flight.append(since is not None)
        waited[0] = 0.0
        trainer.step(before_update)
        loop.update_wait_s.append(waited[0])
        if loop.saves and loop.saves[-1].update_wait_s is None:
            loop.saves[-1].update_wait_s = waited[0]  # the first state change after that save
        if since is not None and not peer.poll():
            loop.saves[-1].durable_s, since = perf_counter() - since, None
        loop.step_s.append(perf_counter() - begin)
        if s in saving:
            begin = perf_counter()
            fingerprint = trainer.fingerprint()
            untimed += perf_counter() - begin
            wait_s = 0.0 if since is None else _finish(peer, loop.saves[-1], since)
            path = new_path()
            called = perf_counter()
            peer.save(trainer.state_dict(), path)
            save = Save(s, path, wait_s, perf_counter() - called, fingerprint=fingerprint)
            if peer.synchronous:
                save.durable_s, since = save.call_s, None
            else:
                since = called
            loop.saves.append(save)
    if since is not None:
        loop.final_wait_s = _finish(peer, loop.saves[-1], since)
    loop.wall_s = perf_counter() - start - untimed
    return loop


def _finish(peer: Peer, save: Save, since: float) -> float:
    """Wait for `save`, in flight since `since`; record when it was done. Returns the seconds waited."""
    begin = perf_counter()
    peer.wait()
    now = perf_counter()
    save.durable_s = now - since
    return now - begin


def verify(loop: Loop, family: str, trainer: Trainer) -> dict[int, list[str]]:
    """Load each save of `loop` and compare it with the fingerprint taken at its step.

    Returns {step: names that differ} for the saves that do not hold their step's state ({} if all do).
    """
    wrong = {}
    for save in loop.saves:
        names = mismatches(load(family, save.path, trainer), save.fingerprint, trainer)
        if names:
            wrong[save.step] = names
    return wrong
