"""Helpers for replication: the clique layout, exchange plans, moving a TASD over a process group.

A TensorAwareStateDict (TASD) crosses a process group in two messages: the hollow object (pickled)
with its tensors' shapes and dtypes, then all tensor bytes packed into one uint8 buffer. The buffer
travels on the device the group's backend needs (the current GPU for NCCL, the CPU otherwise) and
arrives on ``target_device``. The sender's TASD is left as it was.

``batched(iterable, n)`` (NVRx's helper, ``itertools.batched`` of Python 3.12): tuples of ``n`` items, the last
one shorter when the items run out.
"""

from __future__ import annotations

import copy
import itertools
import logging
from collections.abc import Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import torch
import torch.distributed as dist

from ...utils import collective_device
from ..base_state_dict import TensorAwareStateDict

__all__ = [
    "ExchangePlan",
    "ExchangePlanEntry",
    "T",
    "batched",
    "broadcast_state_dict",
    "local_copy",
    "parse_group_sequence",
    "recv_state_dict",
    "send_state_dict",
]

Layout = list[tuple[torch.Size, torch.dtype]]
T = TypeVar("T")

logger = logging.getLogger(__name__)


def batched(iterable: Iterable[T], n: int) -> Iterator[tuple[T, ...]]:
    """Consecutive tuples of ``n`` items of ``iterable`` (the last may be shorter); ValueError if ``n < 1``."""
    if n < 1:
        raise ValueError(f"n must be at least one, got {n!r}")
    items = iter(iterable)
    while chunk := tuple(itertools.islice(items, n)):
        yield chunk


def parse_group_sequence(replication_jump: int, replication_factor: int, world_size: int) -> list[list[int]]:
    """The cliques of ``world_size`` ranks, sorted: in each block of J*F consecutive ranks starting at
    s, the ranks s+b, s+b+J, ..., s+b+(F-1)J form a clique, for every b < J.

    Raises ValueError unless J >= 1, F >= 1 and J*F divides world_size.
    """
    layout = (
        f"replication_jump={replication_jump!r}, replication_factor={replication_factor!r}, world_size={world_size!r}"
    )
    for name, value in (
        ("replication_jump", replication_jump),
        ("replication_factor", replication_factor),
        ("world_size", world_size),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"invalid replication layout ({layout}): {name} must be a positive int")
    block = replication_jump * replication_factor
    if world_size % block:
        raise ValueError(
            f"invalid replication layout ({layout}): the world size must be a multiple of jump * factor = {block}"
        )
    return sorted(
        list(range(start + b, start + block, replication_jump))
        for start in range(0, world_size, block)
        for b in range(replication_jump)
    )


@dataclass(frozen=True)
class ExchangePlanEntry:
    sender: int
    receiver: int
    id_: Hashable


@dataclass
class ExchangePlan:
    """Who sends which part to whom (global ranks), in an order every member of the group follows."""

    entries: list[ExchangePlanEntry] = field(default_factory=list)

    def plan(self, sender: int, receiver: int, id_: Hashable) -> None:
        self.entries.append(ExchangePlanEntry(sender, receiver, id_))

    def required_ids(self, rank: int | None = None) -> set[Hashable]:
        """The ids ``rank`` (default: this rank) must provide, to others or to itself."""
        rank = dist.get_rank() if rank is None else rank
        return {e.id_ for e in self.entries if e.sender == rank}


def _nbytes(layout: Layout) -> int:
    return sum(torch.Size(shape).numel() * dtype.itemsize for shape, dtype in layout)


def _as_bytes(tensor: torch.Tensor) -> torch.Tensor:
    flat = tensor.detach().reshape(-1)
    if flat.numel() == 0:
        return torch.empty(0, dtype=torch.uint8, device=flat.device)
    if flat.stride(0) != 1:  # views, including one-element ones that count as contiguous
        flat = flat.clone(memory_format=torch.contiguous_format)
    return flat.view(torch.uint8)


def _pack(tensors: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    flat = [_as_bytes(t).to(device) for t in tensors]
    return torch.cat(flat) if flat else torch.empty(0, dtype=torch.uint8, device=device)


def _unpack(buffer: torch.Tensor, layout: Layout, target_device: torch.device | str) -> list[torch.Tensor]:
    out, offset, buffer = [], 0, buffer.to(target_device)
    for shape, dtype in layout:
        size = torch.Size(shape).numel() * dtype.itemsize
        out.append(buffer[offset : offset + size].clone().view(dtype).reshape(shape))
        offset += size
    return out


def _header(tasd: TensorAwareStateDict) -> tuple[list[Any], list[torch.Tensor]]:
    """([hollow copy, layout], tensors): the message describing ``tasd``, which is left intact."""
    tensors = tasd.pop_tensors()
    try:
        hollow = copy.deepcopy(tasd)
    finally:
        tasd.insert_tensors(tensors)
    return [hollow, [(t.shape, t.dtype) for t in tensors]], tensors


def local_copy(tasd: TensorAwareStateDict, target_device: torch.device | str) -> TensorAwareStateDict:
    """A copy of ``tasd`` whose tensors are copies on ``target_device`` (no communication)."""
    (hollow, _), tensors = _header(tasd)
    hollow.insert_tensors([t.detach().to(target_device, copy=True) for t in tensors])
    return cast(TensorAwareStateDict, hollow)


def broadcast_state_dict(
    tasd: TensorAwareStateDict | None, src: int, group: dist.ProcessGroup | None, target_device: torch.device | str
) -> TensorAwareStateDict:
    """Collective over ``group``: global rank ``src`` passes ``tasd`` and gets it back as it was;
    every other member passes None and gets a copy."""
    device = collective_device(group)
    sent: TensorAwareStateDict | None = None  # this rank's own, when it is the source
    if dist.get_rank() == src:
        assert tasd is not None, "the source rank passes its state dict"
        sent = tasd
        header, tensors = _header(tasd)
        dist.broadcast_object_list(header, src=src, group=group)
        buffer = _pack(tensors, device)
    else:
        header = [None, None]
        dist.broadcast_object_list(header, src=src, group=group)
        buffer = torch.empty(_nbytes(header[1]), dtype=torch.uint8, device=device)
    if buffer.numel():
        dist.broadcast(buffer, src=src, group=group)
    if sent is not None:
        return sent
    header[0].insert_tensors(_unpack(buffer, header[1], target_device))
    return cast(TensorAwareStateDict, header[0])


def send_state_dict(tasd: TensorAwareStateDict, dst: int, group: dist.ProcessGroup | None) -> None:
    """Point-to-point: send ``tasd`` to global rank ``dst``."""
    header, tensors = _header(tasd)
    dist.send_object_list(header, dst=dst, group=group)
    buffer = _pack(tensors, collective_device(group))
    if buffer.numel():
        dist.send(buffer, dst=dst, group=group)


def recv_state_dict(
    src: int, group: dist.ProcessGroup | None, target_device: torch.device | str
) -> TensorAwareStateDict:
    """Point-to-point: receive the TASD that global rank ``src`` sends."""
    header: list[Any] = [None, None]
    dist.recv_object_list(header, src=src, group=group)
    buffer = torch.empty(_nbytes(header[1]), dtype=torch.uint8, device=collective_device(group))
    if buffer.numel():
        dist.recv(buffer, src=src, group=group)
    header[0].insert_tensors(_unpack(buffer, header[1], target_device))
    return cast(TensorAwareStateDict, header[0])
