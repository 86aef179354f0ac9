"""The protocol layer: what any asynchronous checkpoint save offers, whatever library provides it.

Five calls, implemented in a few lines by each target's adapter (`protocol_saver(**options)`, capability
"protocol"), so the `P-*` clauses (ckptspec/spec/clauses/protocol.toml) judge NVRx, Megatron-Core, torch DCP's
`async_save` and impl alike:

    saver = protocol_saver()             a Saver: what a trainer keeps between saves
    handle = saver.start(state, path)    start saving `state` to directory `path`; collective
    handle.staged()                      returns once `state` may be changed (its snapshot is taken)
    handle.wait()                        returns once the checkpoint is durable and committed; raises if the
                                         save failed on any rank; collective
    handle.abort()                       stops the save without waiting for it
    saver.close()                        waits for what is in flight and ends every thread and process
                                         the saver started

Bounds are the caller's (asserts.bounded): a method may block forever; the spec says it must not.
A target lacking a call raises NotImplementedError from it, which the clause citing it records as a failure.

`protocol_saver(**options)` has one signature for every adapter (ckptspec.spec.harness.surface.contract.ProtocolAdapter): the
options are SAVER_OPTIONS, each a preference the tests state, and an adapter ignores the options it does not know.
Where the checkpoint lies and how it is read back is the adapter's FORMAT (ckptspec.spec.harness.surface.formats; torch DCP's
by default), so a library with its own format is judged by the same clauses.
"""

from __future__ import annotations

import abc
from typing import Any

from ckptspec.spec.harness.surface.loading import MissingCapability, Target, current_target

__all__ = ["SAVER_OPTIONS", "SaveHandle", "Saver", "protocol_saver"]

SAVER_OPTIONS = {
    "persistent": "bool: where a target has a choice of callers, a persistent worker (True) or a process per save "
    "(False); the durability and crash tests ask for False, whose writes the fault layer can see",
}
"""The options the tests pass to protocol_saver(**options), and what each asks for; every one may be ignored."""


class SaveHandle(abc.ABC):
    """One save in flight (see the module docstring)."""

    def staged(self) -> None:
        """Return once the state dict handed to start() may be changed; default: at once (copied in start)."""
        return

    @abc.abstractmethod
    def wait(self) -> Any:
        """Return once the checkpoint is durable and committed on every rank; raise if it failed on any."""

    def abort(self) -> None:
        """Stop this save without waiting for it; nothing of it may be committed afterwards unless complete."""
        raise NotImplementedError("this target has no way to abort a save in flight")


class Saver(abc.ABC):
    """What a trainer keeps between saves: queues, workers, stagers (see the module docstring)."""

    @abc.abstractmethod
    def start(self, state_dict: dict[str, Any], path: str) -> SaveHandle:
        """Start saving state_dict to the directory `path`; collective over the default process group."""

    @abc.abstractmethod
    def close(self) -> None:
        """Wait for saves in flight, then end every thread and process this saver started."""


def protocol_saver(target: Target | None = None, **options: Any) -> Saver:
    """A new Saver of `target` (the current one by default); MissingCapability if its adapter has none.

    `options` are SAVER_OPTIONS; an unknown one is a mistake of the caller (ValueError), not of the target."""
    unknown = sorted(set(options) - set(SAVER_OPTIONS))
    if unknown:
        raise ValueError(f"unknown saver options {', '.join(unknown)}; known: {', '.join(SAVER_OPTIONS)}")
    target = target or current_target()
    make = getattr(target.adapter, "protocol_saver", None)
    if make is None or not target.has("protocol"):
        raise MissingCapability(f"target {target.name!r} has no protocol adapter")
    saver: Saver = make(**options)
    return saver
