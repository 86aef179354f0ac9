"""The manager contract (ckptspec.spec.harness.surface.manager_api) over a target's `LocalCheckpointManager`: NVRx's (0.4.1, 0.7.0)
and impl's (`ckptspec/impl/local`, target `impl-local`), the same adapter over `local.ckpt_managers.local_manager`.

How the contract maps onto the local manager, as NVRx's usage guide (seed 001) integrates it:

- save(step, state): `save(TASD(state), step, is_async=False)`, the guide's own call ('performs a blocking save
  operation, ensuring all data is written before returning'). The asynchronous path only hands the same save to
  an `AsyncCallsQueue`, which the AQ-* clauses judge; here the manager's own protocol is judged, alone.
- wait(): nothing is left in flight once save() returned; close() likewise.
- latest(): `find_latest()` on this manager (-1 is None); resume(template): `find_latest()`, then `load()`, as the
  guide's resume does. load(step, template): the local manager loads only the iteration `find_latest()` found, so
  any other step raises LookupError (the older ones are gone anyway: see retention below).
- Retention: the manager has no setting. Its `_cleanup` ('Removes outdated or invalid checkpoints after
  successfully saving the checkpoint for the specified iteration', NVRx 0.4.1 and 0.7.0) keeps the newest
  iteration only; `keep` is therefore ignored and the target lacks capability `manager_retention`, so the clauses
  about a retention setting are not applicable. Pointer: none (find_latest scans every rank's parts), no
  capability `manager_pointer`.
- Layout: `<root>/<rank>/iter_<step:07d>_<rank>_<tag>.pt` (session id ''), a part being written carries `.dirty`
  in its name; steps() lists this rank's part files, clean or dirty; location(step) is this rank's clean part,
  copies(step) every clean part of that step under root.

The state dict goes in as `StepState`, a TensorAwareStateDict of CPU tensors (the guide asks for a custom one where
BasicTensorAwareStateDict's CUDA requirement does not hold), a subclass of the target's base class.
"""

from __future__ import annotations

import copy
import os
import re
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ckptspec.spec.harness.surface.loading import MissingCapability, current_target
from ckptspec.spec.harness.surface.manager_api import CheckpointManager

__all__ = ["Hole", "LocalManager", "StepState"]

_PART = re.compile(r"iter_(\d+)_(\d+)_")


def _base() -> Any:
    """The current target's TensorAwareStateDict; `object` where it has none (this module then only collects)."""
    try:
        return current_target().module("local.base_state_dict").TensorAwareStateDict
    except MissingCapability:
        return object


class Hole:
    """What a popped tensor leaves in its place: its shape and dtype."""

    def __init__(self, tensor: torch.Tensor):
        self.shape, self.dtype = tuple(tensor.shape), tensor.dtype


def _slots(tree: Any) -> Iterator[tuple[Any, Any]]:
    """(container, key) of every leaf under `tree` (dicts and lists), depth first."""
    for key in list(tree) if isinstance(tree, dict) else range(len(tree)):
        if isinstance(tree[key], (dict, list)):
            yield from _slots(tree[key])
        else:
            yield tree, key


class StepState(_base()):  # type: ignore[misc]  # the target's TensorAwareStateDict, resolved at import
    """A state dict of CPU tensors nested in dicts and lists, behind the TensorAwareStateDict interface."""

    def __init__(self, state_dict: dict[str, Any]):
        self.state_dict = state_dict
        self.hollow = False

    @property
    def is_hollow(self) -> bool:
        return self.hollow

    @property
    def tensors(self) -> list[torch.Tensor]:
        return [c[k] for c, k in _slots(self.state_dict) if isinstance(c[k], torch.Tensor)]

    def pop_tensors(self) -> list[torch.Tensor]:
        if self.hollow:
            raise RuntimeError("pop_tensors() on a hollow state dict")
        popped = self.tensors
        for c, k in _slots(self.state_dict):
            if isinstance(c[k], torch.Tensor):
                c[k] = Hole(c[k])
        self.hollow = True
        return popped

    def insert_tensors(self, tensor_data: Iterable[torch.Tensor]) -> None:
        holes = [(c, k) for c, k in _slots(self.state_dict) if isinstance(c[k], Hole)]
        data = list(tensor_data)
        if not self.hollow or len(data) != len(holes):
            raise RuntimeError(f"insert_tensors(): {len(data)} tensors for {len(holes)} holes")
        for (c, k), tensor in zip(holes, data, strict=True):
            c[k] = tensor
        self.hollow = False

    def init_tensors(self) -> None:
        holes = [c[k] for c, k in _slots(self.state_dict) if isinstance(c[k], Hole)]
        self.insert_tensors([torch.empty(h.shape, dtype=h.dtype) for h in holes])

    def copy_tensors_to_cpu(self, non_blocking: bool = False) -> None:
        for c, k in _slots(self.state_dict):
            if isinstance(c[k], torch.Tensor):
                c[k] = c[k].detach().to("cpu", copy=True)

    def restore_tensor_device(self, non_blocking: bool = True) -> None:
        """Nothing to move: every tensor is a CPU tensor."""


# impl's parts load with torch.load(weights_only=True): allow exactly the classes a part holds, as a user must.
torch.serialization.add_safe_globals([StepState, Hole])


def _rank() -> int:
    dist = torch.distributed
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


class LocalManager(CheckpointManager):
    """The target's LocalCheckpointManager behind the manager contract (see the module docstring)."""

    def __init__(self, root: str, keep: int):
        self.root, self.keep = root, keep  # keep: ignored, the manager keeps the newest iteration only
        local = current_target().module("local.ckpt_managers.local_manager")
        self.manager = local.LocalCheckpointManager(root)

    def save(self, step: int, state_dict: dict[str, Any]) -> None:
        self.manager.save(StepState(copy.deepcopy(state_dict)), step, is_async=False)

    def wait(self) -> None:
        """Every save is synchronous: nothing is in flight."""

    def latest(self) -> int | None:
        step = int(self.manager.find_latest())
        return None if step < 0 else step

    def _state(self, template: dict[str, Any]) -> dict[str, Any]:
        loaded, _ = self.manager.load()
        return {key: loaded.state_dict[key] for key in template}

    def resume(self, template: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        step = self.latest()
        return None if step is None else (step, self._state(template))

    def load(self, step: int, template: dict[str, Any]) -> dict[str, Any]:
        found = self.latest()
        if found != step:
            raise LookupError(f"the local manager loads only its latest iteration, {found}, not {step}")
        return self._state(template)

    def _parts(self, folder: str) -> list[tuple[int, str]]:
        if not os.path.isdir(folder):
            return []
        return [(int(m.group(1)), n) for n in sorted(os.listdir(folder)) if (m := _PART.match(n))]

    def location(self, step: int) -> str:
        folder = os.path.join(self.root, str(_rank()))
        clean = [n for s, n in self._parts(folder) if s == step and ".dirty" not in n]
        return os.path.join(folder, clean[0] if clean else f"iter_{step:07d}_{_rank()}_local.pt")

    def copies(self, step: int) -> list[str]:
        folders = (
            [os.path.join(self.root, n) for n in sorted(os.listdir(self.root))] if os.path.isdir(self.root) else []
        )
        found = [os.path.join(f, n) for f in folders for s, n in self._parts(f) if s == step and ".dirty" not in n]
        return found or [self.location(step)]

    def steps(self) -> list[int]:
        return sorted({s for s, _ in self._parts(os.path.join(self.root, str(_rank())))})

    def close(self) -> None:
        """Nothing to end: the manager starts no thread when it saves synchronously."""
