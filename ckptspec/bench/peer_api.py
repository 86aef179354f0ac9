"""What every benchmark peer offers: the three calls a training loop makes, and what the peer says about itself.

    phases = peer.save(state_dict, path)   # returns when the trainer may go on; {step: seconds}
    peer.before_update()                   # before the trainer changes the state in place (optimizer step)
    peer.poll()                            # a training step's non-blocking finalize; True while a save runs
    peer.wait()                            # returns once the last save is committed on every rank
    peer.close()

The peers themselves are `ckptspec.bench.peers` (one per checkpointing method) and `ckptspec.bench.adapter_peer`
(a protocol `Saver` of any target); both build on this base and neither imports the other's classes.
"""

from __future__ import annotations

__all__ = ["Peer"]


class Peer:
    """Base: `name`, `family`, `durable`, `synchronous`; subclasses implement save/poll/wait/close."""

    name = family = ""
    note: str | None = None  # what the benchmark's row must say about how this peer was run
    durable = True
    synchronous = False  # the save is complete when save() returns

    def save(self, state_dict, path: str) -> dict[str, float]:
        raise NotImplementedError

    def before_update(self) -> None:
        """Called before the trainer changes the saved tensors in place; a peer whose snapshot completes
        in the background waits for it here. Nothing to wait for by default: save() took the snapshot."""

    def poll(self) -> bool:
        """Finalize what has finished, without blocking, as a training loop does every step; True while
        a save is still in flight."""
        return False

    def wait(self) -> None:
        """Nothing to wait for (synchronous peers)."""

    def close(self) -> None:
        """Nothing to release."""
