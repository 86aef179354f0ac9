"""Nested dicts and lists of a state dict: map over them, list their values, compare two of them.

NVRx's public helpers of the same names (``checkpointing.utils`` and ``local.basic_state_dict`` re-export them),
with the same meaning:

* ``dict_list_map_outplace(f, x)``: a new structure of plain dicts and lists with ``f`` applied to every other
  value (``x`` is left as it was); ``dict_list_map_inplace(f, x)`` replaces the values in ``x`` itself and
  returns ``x``. Tuples and other containers are values, not containers.
* ``nested_values(x)``: every non-container value under ``x``, depth first.
* ``diff(x1, x2)``: ``(only_left, only_right, mismatch)``. The first two list the key paths (tuples of dict keys
  and list indices) present on one side only; ``mismatch`` lists ``(path, type of left, type of right)`` for the
  values present on both sides that differ: tensors by shape, dtype and every element (compared on the CPU),
  other values with ``!=`` (a comparison that raises, or gives no single bool, counts as a difference).
  Lists and tuples are compared item by item, NumPy arrays as their ``tolist()``; an object with a
  ``replica_id`` (Megatron-Core's sharded tensors) by its ``data``.
  Decision: an index present on one side only is reported as its full path, on the side that has it (NVRx 0.4.1
  and 0.7.0 report the bare indices, in both lists).
* ``preload_tensors(state_dict, non_blocking=True)``: ``state_dict`` (its dicts and lists copied) with every
  tensor moved to host memory (a CPU tensor is kept as it is).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch

__all__ = ["dict_list_map_inplace", "dict_list_map_outplace", "diff", "nested_values", "preload_tensors"]


def dict_list_map_outplace(f: Callable[[Any], Any], x: Any) -> Any:
    """A copy of the dicts and lists of ``x`` with ``f`` applied to every other value."""
    if isinstance(x, dict):
        return {key: dict_list_map_outplace(f, value) for key, value in x.items()}
    if isinstance(x, list):
        return [dict_list_map_outplace(f, value) for value in x]
    return f(x)


def dict_list_map_inplace(f: Callable[[Any], Any], x: Any) -> Any:
    """Replace every non-container value under ``x`` by ``f(value)``, in place; return ``x`` (or ``f(x)`` for a
    value that is no dict or list)."""
    if isinstance(x, dict):
        for key in list(x):
            x[key] = dict_list_map_inplace(f, x[key])
        return x
    if isinstance(x, list):
        x[:] = [dict_list_map_inplace(f, value) for value in x]
        return x
    return f(x)


def nested_values(x: dict[Any, Any] | list[Any]) -> Iterator[Any]:
    """Every value under ``x`` that is no dict or list, depth first."""
    for value in x.values() if isinstance(x, dict) else x:
        if isinstance(value, (dict, list)):
            yield from nested_values(value)
        else:
            yield value


def _differ(x1: Any, x2: Any) -> bool:
    if isinstance(x1, torch.Tensor) and isinstance(x2, torch.Tensor):
        if x1.shape != x2.shape or x1.dtype != x2.dtype:
            return True
        return not torch.equal(x1.detach().cpu(), x2.detach().cpu())
    try:
        return bool(x1 != x2)
    except Exception:
        return True


def _is_numpy_array(x: Any) -> bool:
    return type(x).__module__ == "numpy" and type(x).__name__ == "ndarray"


def diff(x1: Any, x2: Any, prefix: tuple[Any, ...] = ()) -> tuple[list[Any], list[Any], list[Any]]:
    """(paths only in ``x1``, paths only in ``x2``, (path, type, type) of values that differ); see the module."""
    if _is_numpy_array(x1) and _is_numpy_array(x2):
        return diff(x1.tolist(), x2.tolist(), prefix)
    if isinstance(x1, dict) and isinstance(x2, dict):
        only_left = [(*prefix, k) for k in x1 if k not in x2]
        only_right = [(*prefix, k) for k in x2 if k not in x1]
        pairs = [(k, x1[k], x2[k]) for k in x1 if k in x2]
    elif isinstance(x1, (list, tuple)) and type(x1) is type(x2):
        only_left = [(*prefix, i) for i in range(len(x2), len(x1))]
        only_right = [(*prefix, i) for i in range(len(x1), len(x2))]
        pairs = list(zip(range(len(x1)), x1, x2, strict=False))
    elif hasattr(x1, "replica_id") and hasattr(x2, "replica_id") and type(x1) is type(x2):
        return diff(x1.data, x2.data, (*prefix, type(x1)))
    else:
        return [], [], [(prefix, type(x1), type(x2))] if _differ(x1, x2) else []
    mismatch: list[Any] = []
    for key, left, right in pairs:
        sub_left, sub_right, sub_mismatch = diff(left, right, (*prefix, key))
        only_left += sub_left
        only_right += sub_right
        mismatch += sub_mismatch
    return only_left, only_right, mismatch


def preload_tensors(state_dict: Any, non_blocking: bool = True) -> Any:
    """A copy of ``state_dict`` (its dicts and lists) with every tensor moved to host memory."""
    return dict_list_map_outplace(
        lambda v: v.detach().to("cpu", non_blocking=non_blocking) if isinstance(v, torch.Tensor) else v, state_dict
    )
