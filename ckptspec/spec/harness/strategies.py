"""Hypothesis strategies for state dicts and tensors (CPU unless a device is asked for)."""

from __future__ import annotations

import math
from typing import Any

import torch
from hypothesis import strategies as st

__all__ = [
    "DTYPES",
    "WEAK_STATE",
    "dcp_state_dicts",
    "mutate_in_place",
    "neither_old_nor_mutated",
    "private_copy",
    "replication_layouts",
    "replication_params",
    "state_dicts",
    "tensors",
]

DTYPES = (
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int8,
    torch.uint8,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
)


@st.composite
def tensors(draw: st.DrawFn, *, max_numel: int = 48, device: str = "cpu", views: bool = True) -> torch.Tensor:
    """Small tensors of every dtype: empty, scalar, contiguous, transposed or strided views."""
    dtype = draw(st.sampled_from(DTYPES), label="dtype")
    shape = draw(st.lists(st.integers(0, 4), max_size=3), label="shape")
    if math.prod(shape) > max_numel:
        shape = shape[:1]
    seed = draw(st.integers(0, 2**16), label="seed")
    values = torch.randint(
        0, 2 if dtype == torch.bool else 16, (math.prod(shape),), generator=torch.Generator().manual_seed(seed)
    )
    base = values.to(dtype).reshape(shape).to(device)
    kind = draw(st.sampled_from(["plain", "transposed", "strided"] if views else ["plain"]), label="view")
    if kind == "transposed" and base.dim() >= 2:
        return base.transpose(0, 1)
    if kind == "strided" and base.dim() >= 1:
        return base[::2]
    return base


def state_dicts(
    *, max_leaves: int = 6, device: str = "cpu", with_tensors: bool = True, views: bool = True
) -> st.SearchStrategy[dict[str, Any]]:
    """Nested dicts and lists of tensors and plain Python values, keyed by short strings."""
    plain = [st.integers(-5, 5), st.text(max_size=4), st.binary(max_size=4)]
    tensor = tensors(device=device, views=views)
    leaf = st.one_of(*([tensor, tensor] if with_tensors else []), *plain)
    tree = st.recursive(
        leaf,
        lambda inner: st.one_of(
            st.lists(inner, max_size=3), st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), inner, max_size=3)
        ),
        max_leaves=max_leaves,
    )
    return st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4), tree, min_size=1, max_size=4)


def mutate_in_place(obj: object) -> None:
    """Change every element of every tensor in obj, in place (what a training step does)."""
    if isinstance(obj, torch.Tensor):
        obj.logical_not_() if obj.dtype == torch.bool else obj.add_(1)
    elif isinstance(obj, dict):
        for value in obj.values():
            mutate_in_place(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            mutate_in_place(value)


# A fixed state dict for the weak snapshot levels: float, integer and half tensors whose elements +1 are exact.
WEAK_STATE = {"w": torch.arange(64.0), "n": 3, "deep": {"i": torch.arange(5), "h": torch.full((4,), 0.5).half()}}


def neither_old_nor_mutated(got: Any, old: Any, where: str = "") -> list[str]:
    """Where `got` (a loaded state dict) holds something other than `old` or `old` after mutate_in_place (tensors +1,
    the rest unchanged), element by element: what a weak snapshot level forbids. Bool tensors are not judged
    (mutate_in_place negates them: every value is old or new)."""
    if isinstance(old, dict):
        if not isinstance(got, dict) or set(got) != set(old):
            return [
                f"{where or 'the state dict'}: keys {sorted(got) if isinstance(got, dict) else got!r}, saved {sorted(old)}"
            ]
        return [p for key in old for p in neither_old_nor_mutated(got[key], old[key], f"{where}[{key!r}]")]
    if not isinstance(old, torch.Tensor):
        return [] if got == old else [f"{where}: {got!r}, saved {old!r}"]
    if not isinstance(got, torch.Tensor) or got.shape != old.shape or got.dtype != old.dtype:
        return [f"{where}: {got!r} where a {old.dtype} tensor of shape {tuple(old.shape)} was saved"]
    got = got.cpu()
    bad = ~((got == old) | (got == old + 1)).flatten()
    if not bad.any():
        return []
    i = int(bad.nonzero()[0])
    seen, before = got.flatten()[i].item(), old.flatten()[i].item()
    return [
        f"{where}: {int(bad.sum())} of {old.numel()} elements neither old nor changed, first [{i}] = {seen} ({before} or {before + 1} saved)"
    ]


def private_copy(obj: Any, device: str | None = None) -> Any:
    """Copy the tensors of a nested state dict into private memory, on `device` if given (else where they are).

    What arrives over the rank pool's pipe lives in shared memory, where fork gives no copy-on-write;
    a trainer's tensors live in private memory (or on its GPU: `devices.current()` in the snapshot family).
    """
    if isinstance(obj, torch.Tensor):
        return obj.clone() if device is None else obj.to(device, copy=True)
    if isinstance(obj, dict):
        return {k: private_copy(v, device) for k, v in obj.items()}
    if isinstance(obj, list):
        return [private_copy(v, device) for v in obj]
    return obj


def replication_layouts(world_size: int) -> list[tuple[int, int]]:
    """Every valid (replication_jump, replication_factor) for world_size ranks: jump*factor divides it."""
    return [
        (jump, factor)
        for jump in range(1, world_size + 1)
        for factor in range(1, world_size + 1)
        if world_size % (jump * factor) == 0
    ]


def replication_params(
    world_size: int, *, none: bool = True, min_factor: int = 1
) -> st.SearchStrategy[tuple[int, int] | None]:
    """(replication_jump, replication_factor) valid for world_size ranks, or None (no replication)."""
    layouts = [p for p in replication_layouts(world_size) if p[1] >= min_factor]
    return st.sampled_from(([None] if none else []) + layouts)


@st.composite
def dcp_state_dicts(draw: st.DrawFn, *, max_leaves: int = 8) -> dict[str, Any]:
    """State dicts that torch.distributed.checkpoint round trips, some with tensors sharing one storage.

    Dicts nest freely; lists hold tensors and plain values but no containers (stock DCP cannot load a list
    that holds an empty dict or list next to tensors). Sometimes a base tensor is added with views of it and an
    alias under other keys.
    """
    leaf = st.one_of(tensors(), tensors(), st.integers(-5, 5), st.text(max_size=4), st.binary(max_size=4))
    tree = st.recursive(
        leaf | st.lists(leaf, max_size=3),
        lambda inner: st.dictionaries(st.text("abcxyz", min_size=1, max_size=3), inner, max_size=3),
        max_leaves=max_leaves,
    )
    state_dict = draw(st.dictionaries(st.text("abcdefgh", min_size=1, max_size=4), tree, min_size=1, max_size=4))
    base = draw(st.none() | tensors(views=False), label="shared base")
    if base is not None and base.numel() > 0:
        flat = base.reshape(-1)
        views = {
            "sharedbase": base,
            "sharedalias": base,
            "sharedhead": flat[: (flat.numel() + 1) // 2],
            "sharedstep": flat[1::2],
        }
        keys = draw(st.lists(st.sampled_from(sorted(views)), min_size=1, max_size=4, unique=True), label="shared keys")
        state_dict.update((k, views[k]) for k in keys)
    return state_dict
