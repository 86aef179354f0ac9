"""Hypothesis strategies for state dicts and tensors (CPU unless a device is asked for)."""

from __future__ import annotations

import math

import torch
from hypothesis import strategies as st

__all__ = ["DTYPES", "mutate_in_place", "private_copy", "state_dicts", "tensors"]

DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
          torch.int32, torch.int64, torch.bool, torch.complex64)


@st.composite
def tensors(draw, *, max_numel: int = 48, device: str = "cpu", views: bool = True):
    """Small tensors of every dtype: empty, scalar, contiguous, transposed or strided views."""
    dtype = draw(st.sampled_from(DTYPES), label="dtype")
    shape = draw(st.lists(st.integers(0, 4), max_size=3), label="shape")
    if math.prod(shape) > max_numel:
        shape = shape[:1]
    seed = draw(st.integers(0, 2**16), label="seed")
    values = torch.randint(0, 2 if dtype == torch.bool else 16, (math.prod(shape),),
                           generator=torch.Generator().manual_seed(seed))
    base = values.to(dtype).reshape(shape).to(device)
    kind = draw(st.sampled_from(["plain", "transposed", "strided"] if views else ["plain"]), label="view")
    if kind == "transposed" and base.dim() >= 2:
        return base.transpose(0, 1)
    if kind == "strided" and base.dim() >= 1:
        return base[::2]
    return base


def state_dicts(*, max_leaves: int = 6, device: str = "cpu"):
    """Nested dicts and lists of tensors and plain Python values, keyed by short strings."""
    leaf = st.one_of(tensors(device=device), tensors(device=device), st.integers(-5, 5),
                     st.text(max_size=4), st.binary(max_size=4))
    tree = st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), inner, max_size=3)),
        max_leaves=max_leaves)
    return st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4), tree, min_size=1, max_size=4)


def mutate_in_place(obj) -> None:
    """Change every element of every tensor in obj, in place (what a training step does)."""
    if isinstance(obj, torch.Tensor):
        obj.logical_not_() if obj.dtype == torch.bool else obj.add_(1)
    elif isinstance(obj, dict):
        for value in obj.values():
            mutate_in_place(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            mutate_in_place(value)


def private_copy(obj):
    """Copy the tensors of a nested state dict into private memory.

    What arrives over the rank pool's pipe lives in shared memory, where fork gives no copy-on-write;
    a trainer's tensors live in private memory.
    """
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, dict):
        return {k: private_copy(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [private_copy(v) for v in obj]
    return obj
