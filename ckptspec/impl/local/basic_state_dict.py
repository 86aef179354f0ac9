"""``BasicTensorAwareStateDict``: the TensorAwareStateDict for plain state dicts of CUDA tensors.

Tensors are found only through nested dicts and lists (depth first, in dict insertion order and list
order); anything else, tuples and objects included, is an opaque value. Every tensor found must be a
CUDA tensor, checked at construction (``ValueError`` naming the first offender); other layouts need
a custom TensorAwareStateDict. The wrapped dict is edited in place by pop/insert/copy.

Decisions: misuse (popping twice, inserting into a non-hollow object, a wrong number of tensors)
raises ``RuntimeError`` and changes nothing; ``restore_tensor_device`` moves tensors to the current
CUDA device, since a part may be loaded by another process than the one that saved it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from ..dict_utils import dict_list_map_inplace, nested_values
from .base_state_dict import TensorAwareStateDict

__all__ = ["BasicTensorAwareStateDict", "TensorPlaceholder", "dict_list_map_inplace", "nested_values"]


def _walk(obj: Any, path: str = "state_dict") -> Iterator[tuple[str, Any]]:
    """(path, leaf) for every non-container value reachable through dicts and lists."""
    items = obj.items() if isinstance(obj, dict) else enumerate(obj)
    for key, value in items:
        where = f"{path}[{key!r}]"
        if isinstance(value, (dict, list)):
            yield from _walk(value, where)
        else:
            yield where, value


def _map_leaves(fn: Callable[[Any], Any], obj: Any) -> None:
    """Replace, in place, every leaf reachable through dicts and lists by ``fn(leaf)``."""
    keys = obj.keys() if isinstance(obj, dict) else range(len(obj))
    for key in keys:
        value = obj[key]
        if isinstance(value, (dict, list)):
            _map_leaves(fn, value)
        else:
            obj[key] = fn(value)


class TensorPlaceholder:
    """Stands in for a popped tensor: its shape, dtype and device, no data."""

    def __init__(self, tensor: torch.Tensor):
        self.shape, self.dtype, self.device = tuple(tensor.shape), tensor.dtype, tensor.device

    def init_tensor(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device=self.device)

    def __repr__(self) -> str:
        return f"TensorPlaceholder(shape={self.shape}, dtype={self.dtype}, device={self.device})"


class BasicTensorAwareStateDict(TensorAwareStateDict):
    """Wraps ``state_dict`` (a dict or list) whose tensors are CUDA tensors nested in dicts and lists."""

    def __init__(self, state_dict: dict[Any, Any] | list[Any]) -> None:
        if not isinstance(state_dict, (dict, list)):
            raise TypeError(f"state_dict must be a dict or a list, got {type(state_dict).__name__}")
        for path, value in _walk(state_dict):
            if isinstance(value, torch.Tensor) and not value.is_cuda:
                raise ValueError(
                    f"{path} is a tensor on {value.device}, but BasicTensorAwareStateDict needs CUDA "
                    "tensors; move it to the GPU or use a custom TensorAwareStateDict"
                )
        self.state_dict = state_dict
        self._is_hollow = False

    @property
    def is_hollow(self) -> bool:
        return self._is_hollow

    def _require(self, hollow: bool, what: str) -> None:
        if self._is_hollow != hollow:
            state = "hollow" if self._is_hollow else "not hollow"
            raise RuntimeError(f"{what} is not allowed: the state dict is {state}")

    @property
    def tensors(self) -> list[torch.Tensor]:
        self._require(False, "tensors")
        return [v for _, v in _walk(self.state_dict) if isinstance(v, torch.Tensor)]

    def pop_tensors(self) -> list[torch.Tensor]:
        self._require(False, "pop_tensors")
        popped = self.tensors
        _map_leaves(lambda v: TensorPlaceholder(v) if isinstance(v, torch.Tensor) else v, self.state_dict)
        self._is_hollow = True
        return popped

    def _placeholders(self) -> list[TensorPlaceholder]:
        return [v for _, v in _walk(self.state_dict) if isinstance(v, TensorPlaceholder)]

    def insert_tensors(self, tensor_data: Iterable[torch.Tensor]) -> None:
        self._require(True, "insert_tensors")
        data = list(tensor_data)
        if len(data) != len(self._placeholders()):
            raise RuntimeError(f"insert_tensors got {len(data)} tensors for {len(self._placeholders())} placeholders")
        stack = iter(data)
        _map_leaves(lambda v: next(stack) if isinstance(v, TensorPlaceholder) else v, self.state_dict)
        self._is_hollow = False

    def init_tensors(self) -> None:
        self._require(True, "init_tensors")
        self.insert_tensors([p.init_tensor() for p in self._placeholders()])

    def copy_tensors_to_cpu(self, non_blocking: bool = False) -> None:
        self._require(False, "copy_tensors_to_cpu")
        _map_leaves(
            lambda v: v.to("cpu", non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v, self.state_dict
        )

    def restore_tensor_device(self, non_blocking: bool = True) -> None:
        self._require(False, "restore_tensor_device")
        if not any(True for _ in self.tensors):
            return
        device = torch.device("cuda", torch.cuda.current_device())
        _map_leaves(
            lambda v: v.to(device, non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v, self.state_dict
        )
