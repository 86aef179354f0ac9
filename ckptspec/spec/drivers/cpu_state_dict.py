"""The suite's own TensorAwareStateDict for CPU tensors, so the managers can be specified without a GPU.

The seed (001) requires CUDA tensors for BasicTensorAwareStateDict and tells users with other state
dicts to implement TensorAwareStateDict themselves: this is such an implementation, written against
the interface's documented laws only. It subclasses the target's TensorAwareStateDict (resolved from
the environment in every process, so pickled parts load wherever the target is importable).

Tensors are found through nested dicts and lists; ``copy_tensors_to_cpu`` stores copies (a save must
not see later in-place updates); ``restore_tensor_device`` has nothing to move.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import torch

from ckptspec.spec.harness.surface.loading import current_target
from ckptspec.spec.harness.workloads import PickleGate

__all__ = ["CpuTensorAwareStateDict", "Slot", "TargetsTensorAwareStateDict"]

TargetsTensorAwareStateDict: Any = (
    current_target().module("local.base_state_dict").TensorAwareStateDict
    if current_target().has("local_checkpointing")
    else object
)
"""The target's TensorAwareStateDict base class; `object` for a target without local checkpointing, whose tests
still collect (and skip on `needs`)."""


class Slot:
    """Where a popped tensor was: its shape and dtype."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.shape, self.dtype = tuple(tensor.shape), tensor.dtype

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Slot) and (self.shape, self.dtype) == (other.shape, other.dtype)

    def __repr__(self) -> str:
        return f"Slot({self.shape}, {self.dtype})"


def _leaves(obj: Any) -> Iterator[tuple[Any, Any]]:
    """(container, key) of every non-container value under obj, depth first."""
    keys = list(obj.keys()) if isinstance(obj, dict) else range(len(obj))
    for key in keys:
        if isinstance(obj[key], (dict, list)):
            yield from _leaves(obj[key])
        else:
            yield obj, key


class CpuTensorAwareStateDict(TargetsTensorAwareStateDict):
    """A nested dict/list state dict of CPU tensors and plain values."""

    def __init__(self, state_dict: dict[str, Any]) -> None:
        self.state_dict = state_dict
        self._hollow = False

    def _check(self, hollow: bool, what: str) -> None:
        if self._hollow != hollow:
            raise RuntimeError(f"{what} on a {'hollow' if self._hollow else 'full'} state dict")

    @property
    def is_hollow(self) -> bool:
        return self._hollow

    @property
    def tensors(self) -> list[torch.Tensor]:
        self._check(False, "tensors")
        return [c[k] for c, k in _leaves(self.state_dict) if isinstance(c[k], torch.Tensor)]

    def pop_tensors(self) -> list[torch.Tensor]:
        popped = self.tensors
        for c, k in _leaves(self.state_dict):
            if isinstance(c[k], torch.Tensor):
                c[k] = Slot(c[k])
        self._hollow = True
        return popped

    def insert_tensors(self, tensor_data: Iterable[torch.Tensor]) -> None:
        self._check(True, "insert_tensors")
        slots = [(c, k) for c, k in _leaves(self.state_dict) if isinstance(c[k], Slot)]
        data = list(tensor_data)
        if len(data) != len(slots):
            raise RuntimeError(f"{len(data)} tensors for {len(slots)} slots")
        for (c, k), tensor in zip(slots, data, strict=True):
            c[k] = tensor
        self._hollow = False

    def init_tensors(self) -> None:
        self._check(True, "init_tensors")
        self.insert_tensors(
            [torch.empty(c[k].shape, dtype=c[k].dtype) for c, k in _leaves(self.state_dict) if isinstance(c[k], Slot)]
        )

    def copy_tensors_to_cpu(self, non_blocking: bool = False) -> None:
        self._check(False, "copy_tensors_to_cpu")
        for c, k in _leaves(self.state_dict):
            if isinstance(c[k], torch.Tensor):
                c[k] = c[k].detach().to("cpu", copy=True)

    def restore_tensor_device(self, non_blocking: bool = True) -> None:
        self._check(False, "restore_tensor_device")


# What a user of a custom TensorAwareStateDict does so that parts load with torch.load(weights_only=True)
# (IN-4): allow exactly the classes a part holds (PickleGate: a value some tests put in their state dicts).
torch.serialization.add_safe_globals([CpuTensorAwareStateDict, Slot, PickleGate])
