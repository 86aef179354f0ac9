"""Shared-memory staging: the snapshot ``PersistentAsyncCaller`` takes of a request's tensors.

Contract:

* Trainer side, ``stage`` replaces every tensor reachable through dicts, lists and tuples of a
  request's args/kwargs by a ``Staged`` placeholder (its place in the request's slab) and copies
  the tensor there: one copy per distinct view, so tied tensors stay tied. A ``Slab`` is one Linux
  memfd segment; the ``SlabPool`` keys slabs by byte size and reuses one once its request completes.
* Worker side, ``unstage`` maps the slab behind the one file descriptor that crossed and turns
  placeholders back into tensors, each with its own storage over the shared pages (no copy) and the strides a
  ``clone`` of the original has, so ``torch.save`` writes what torch's ``FileSystemWriter`` writes for it.
* ``lay_out`` is ``stage`` without the copies: the overlapped caller (``overlap``) makes them in the background.
* Landing: the last 8 bytes of a slab (``PROGRESS_BYTES`` reserved past the tensors) count the bytes copied in
  so far, in slab order; ``Slab.set_progress`` writes it after each group of copies (``COPY_GROUP_BYTES`` or
  ``COPY_GROUP_TENSORS``; ``LANDED_ALL`` once every copy is in, ``COPY_FAILED`` if one failed). So ``PersistentAsyncCaller`` sends a request before copying its tensors where the writer may overlap the copies (``writer_may_overlap``), and the
  worker writes each tensor once it has landed (``wait_landed``, called by a function marked
  ``waits_for_landing``, impl's writer) while the trainer copies the next; a call not so marked starts once the
  whole slab has landed (``wait_all_landed``). The copies are made and the counter stored by one thread, in
  order; x86's store order makes a counter the worker reads imply the bytes below it.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from ..utils import tree_map
from .request import AsyncRequest

__all__ = [
    "COPY_FAILED",
    "LANDED_ALL",
    "PROGRESS_BYTES",
    "Slab",
    "SlabPool",
    "Staged",
    "copies_to_host",
    "lay_out",
    "map_slab",
    "map_tensors",
    "stage",
    "unstage",
    "wait_all_landed",
    "wait_landed",
    "waits_for_landing",
]

PROGRESS_BYTES = 64  # reserved at a slab's end; its last 8 bytes count the bytes landed (little-endian int64)
LANDED_ALL = 1 << 62
COPY_FAILED = -1
LANDING_TIMEOUT_S = 300.0  # the trainer copies at memory bandwidth; a dead trainer ends the worker (lifeline)
_PROGRESS = struct.Struct("<q")

_ALIGN = 64  # byte alignment of each staged tensor inside a slab
COPY_GROUP_BYTES = 4 << 20  # copy_in reports the bytes landed at least every 4 MiB ...
COPY_GROUP_TENSORS = 256  # ... or every 256 tensors


def _tensor_key(t: torch.Tensor) -> tuple[Any, ...]:
    """Identity of a tensor view: equal keys mean the same bytes seen the same way (the address of its first
    element, which includes the storage offset, with its device, shape, strides and dtype)."""
    address = t.data_ptr() if t.layout == torch.strided else 0
    if not address:  # not strided, or no elements (no address to tell two apart)
        return ("object", id(t))
    return (t.device, address, t.shape, t.stride(), t.dtype)


def map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """``tree_map`` over tensors, calling ``fn`` once per distinct view (tied tensors stay tied)."""
    memo: dict[tuple[Any, ...], Any] = {}

    def visit(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        key = _tensor_key(x)
        if key not in memo:
            memo[key] = fn(x)
        return memo[key]

    return tree_map(visit, obj)


@dataclass(slots=True, unsafe_hash=True)
class Staged:
    """Placeholder sent instead of a staged tensor: where its bytes are in the request's slab.

    Not a tuple, so that tree_map treats it as a leaf. Not frozen: a frozen dataclass's ``__init__`` costs about
    2 us, paid per tensor per save (nothing changes a placeholder once made).
    """

    offset: int
    numel: int
    dtype: torch.dtype
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as a call with its five values: a third of the time of the dataclass's default state.
        return Staged, (self.offset, self.numel, self.dtype, self.shape, self.stride)


class Slab:
    """One shared-memory segment (a Linux memfd) mapped in the trainer as a uint8 tensor."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.fd = os.memfd_create("ckpt-staging", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, nbytes)
        self._pages = mmap.mmap(self.fd, nbytes)
        self.data = torch.frombuffer(self._pages, dtype=torch.uint8)
        self.pinned = False
        self._typed: dict[torch.dtype, torch.Tensor] = {}  # the whole slab seen as each dtype asked for

    def set_progress(self, landed: int) -> None:
        """Say how many bytes from the slab's start have landed (LANDED_ALL: all; COPY_FAILED: a copy failed)."""
        _PROGRESS.pack_into(self._pages, self.nbytes - _PROGRESS.size, landed)

    def region(self, place: Staged) -> torch.Tensor:
        """The slab's bytes for `place`, seen as the staged tensor (its dtype, shape and clone strides)."""
        # One as_strided of the slab seen as the dtype (a slice, a view and an as_strided cost 4x that): every
        # place is 64-byte aligned and a slab's size a multiple of 64, so the offset is whole elements.
        typed = self._typed.get(place.dtype)
        if typed is None:
            typed = self._typed[place.dtype] = self.data.view(place.dtype)
        return typed.as_strided(place.shape, place.stride, place.offset // place.dtype.itemsize)

    def write(self, place: Staged, t: torch.Tensor) -> None:
        self.region(place).copy_(t.detach())  # detach: copying from a grad-requiring tensor would record it

    def pin(self) -> None:
        # Page-lock the segment once so device-to-host copies into it run at pinned-memory speed (an H100,
        # 2026-11-27: 1 GiB staged at 0.88x the pinned copy into a preallocated buffer).
        if not self.pinned:
            torch.cuda.cudart().cudaHostRegister(self.data.data_ptr(), self.nbytes, 0)
            self.pinned = True

    def close(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.data.data_ptr())
        os.close(self.fd)  # the mapping itself goes when self.data is collected


class SlabPool:
    """Free slabs kept for the next saves; a slab returns here when its request completes.

    Bounded: at most MAX_FREE free slabs stay (the largest, when more are given back). `take(n)` reuses the
    smallest free slab of n to REUSE_FACTOR x n bytes (its tail unused); when no free slab is large enough it first
    frees those too small, so a state dict that grows or changes size leaves no slab per size behind. `clear` frees
    them all (the caller's close).
    """

    MAX_FREE = 2
    REUSE_FACTOR = 2

    def __init__(self) -> None:
        self._free: list[Slab] = []

    def take(self, nbytes: int) -> Slab:
        fits = [s for s in self._free if nbytes <= s.nbytes <= self.REUSE_FACTOR * nbytes]
        if fits:
            slab = min(fits, key=lambda s: s.nbytes)
            self._free.remove(slab)
            return slab
        for small in [s for s in self._free if s.nbytes < nbytes]:
            self._free.remove(small)
            small.close()
        return Slab(nbytes)

    def give(self, slab: Slab | None) -> None:
        if slab is None:
            return
        self._free.append(slab)
        self._free.sort(key=lambda s: s.nbytes, reverse=True)
        while len(self._free) > self.MAX_FREE:
            self._free.pop().close()

    def clear(self) -> None:
        for slab in self._free:
            slab.close()
        self._free.clear()


def copies_to_host(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a ``preload_fn`` body whose only work is copying its argument's tensors to host memory: an overlapped
    caller (``overlap``) stages that argument itself and drops the preload."""
    fn._copies_to_host = True  # type: ignore[attr-defined]
    return fn


def _is_host_copy(preload_fn: Callable[..., Any]) -> bool:
    return bool(getattr(getattr(preload_fn, "func", preload_fn), "_copies_to_host", False))


def lay_out(
    req: AsyncRequest, pool: SlabPool, stage_preloads: bool = False
) -> tuple[AsyncRequest, Slab | None, list[tuple[torch.Tensor, Staged]]]:
    """The request to send, a slab from ``pool`` sized for its tensors, and where each tensor goes in it; nothing
    is copied yet (``Slab.write`` each pair, or copy them in the background).

    Positional argument 1 is dropped when ``preload_fn`` is set: the worker replaces it. With ``stage_preloads``, a
    preload marked ``copies_to_host`` is dropped instead and argument 1 staged here with the rest.
    """
    args = list(req.async_fn_args)
    preload_fn = req.preload_fn
    if preload_fn is not None:
        if stage_preloads and _is_host_copy(preload_fn):
            preload_fn = None
        else:
            args[1] = None
    kwargs = dict(req.async_fn_kwargs or {})
    (args, kwargs), layout, size = _stage_layout((tuple(args), kwargs))
    slab = pool.take(size + PROGRESS_BYTES) if size else None  # else empty: every staged tensor adds to size
    return req._replace(async_fn_args=args, async_fn_kwargs=kwargs, preload_fn=preload_fn), slab, layout


def stage(req: AsyncRequest, pool: SlabPool) -> tuple[AsyncRequest, Slab | None]:
    """Copy the request's tensors into a slab from ``pool`` (``lay_out``, then ``copy_in``); return the request to
    send and its slab."""
    request, slab, layout = lay_out(req, pool)
    if slab is not None:
        copy_in(slab, layout)
    return request, slab


def copy_in(slab: Slab, layout: list[tuple[torch.Tensor, Staged]]) -> None:
    """Copy each tensor to its place, in slab order, counting the bytes landed after each group (``set_progress``);
    a failed copy sets COPY_FAILED and raises. Returns once every copy has landed.

    CUDA tensors (all on one device) are copied into the pinned slab without blocking, on a side stream that first
    waits for the trainer's queued work, one event per group: the host waits for each group's event in order
    before counting it, so the worker writes the first groups while the device copies the next. Tensors of
    several devices are copied one by one, blocking."""
    devices = {t.device for t, _ in layout if t.is_cuda}
    if devices:
        slab.pin()
    side = side_stream(devices.pop()) if len(devices) == 1 else None
    queued: list[tuple[Any, int]] = []  # (event, bytes landed once it has happened), in slab order
    try:
        # Copies go in groups (one torch call per group; a copy_ per tensor costs about 3 us more), each group
        # ending at COPY_GROUP_BYTES or COPY_GROUP_TENSORS, so the writer still starts after the first few MiB.
        # no_grad: copying from a grad-requiring tensor would otherwise be recorded.
        with torch.no_grad(), torch.cuda.stream(side) if side is not None else contextlib.nullcontext():

            def copy_group(regions: list[torch.Tensor], sources: list[torch.Tensor], end: int) -> None:
                if side is None:
                    torch._foreach_copy_(regions, sources)
                    slab.set_progress(end)
                else:  # one copy_ each: a device-to-host copy is queued, not made
                    for region, source in zip(regions, sources, strict=True):
                        region.copy_(source, non_blocking=True)
                    event = torch.cuda.Event()
                    event.record(side)
                    queued.append((event, end))

            regions, sources, landed = [], [], 0
            for t, place in layout:
                regions.append(slab.region(place))
                sources.append(t)
                end = place.offset + place.numel * place.dtype.itemsize
                if end - landed >= COPY_GROUP_BYTES or len(regions) >= COPY_GROUP_TENSORS:
                    copy_group(regions, sources, end)
                    regions, sources, landed = [], [], end
            if regions:
                copy_group(regions, sources, end)
        for event, end in queued:
            event.synchronize()
            slab.set_progress(end)
    except BaseException:
        if side is not None:
            with contextlib.suppress(Exception):  # a device that failed the copy may fail this too
                side.synchronize()  # no queued copy may still write into the slab the pool takes back
        slab.set_progress(COPY_FAILED)
        raise
    slab.set_progress(LANDED_ALL)


def writer_may_overlap(layout: list[tuple[torch.Tensor, Staged]]) -> bool:
    """Whether the worker should write while these copies are made (the request sent before them), or once they
    have all landed (sent after them).

    Always where a tensor is on a GPU: a device-to-host copy is the device's DMA, not the host's cores. For host
    copies only where the copy leaves the writer a core: torch copies a large tensor on all its intra-op threads,
    and a writer sharing those cores (and their memory bandwidth) slows every copy. Measured on the 2-core machine,
    1 GiB in 33 tensors, 8 interleaved pairs in one process: with the trainer's 2 threads the overlap doubled the
    stall (276 ms against 148, paired ratios 1.35-2.22x) and gained nothing on the time to committed (1.46 s
    against 1.44 s); with 1 thread both were within noise (stall 203 against 193 ms, committed 1.40 against 1.47 s).
    """
    if any(t.is_cuda for t, _ in layout):
        return True
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return cores > torch.get_num_threads()


def side_stream(device: torch.device) -> Any:
    """The copies' side stream of ``device`` (one per device, kept, for both staging paths), made to wait for the
    trainer's work queued so far."""
    side = _SIDE_STREAMS.get(device)
    if side is None:
        side = _SIDE_STREAMS[device] = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))  # the values the trainer's queued work leaves
    return side


_SIDE_STREAMS: dict[torch.device, Any] = {}


def _stage_layout(obj: Any) -> tuple[Any, list[tuple[torch.Tensor, Staged]], int]:
    """Replace tensors in ``obj`` by slab placeholders; return (obj, [(tensor, place)], size)."""
    layout: list[tuple[torch.Tensor, Staged]] = []
    size = 0

    def place(t: torch.Tensor) -> Any:
        nonlocal size
        if t.layout != torch.strided or t.is_quantized or t.numel() == 0:
            return t.detach().clone()  # rare or empty: a private copy, pickled by torch
        # The strides a clone would get: a dense tensor keeps its own, so torch.save writes the same bytes
        # (asking a meta tensor costs about 20 us, so only where the tensor is not contiguous).
        stride = t.stride() if t.is_contiguous() else torch.empty_like(t, device="meta").stride()
        staged = Staged(size, t.numel(), t.dtype, tuple(t.shape), tuple(stride))
        layout.append((t, staged))
        nbytes = t.numel() * t.element_size()
        size += -(-nbytes // _ALIGN) * _ALIGN
        return staged

    return map_tensors(place, obj), layout, size


_WORKER_SLAB_MAPS: dict[tuple[int, int, int], mmap.mmap] = {}
_WORKER_MAPS_KEPT = 4  # SlabPool.MAX_FREE plus the requests in flight at once, with room to spare


def map_slab(fd: int, nbytes: int) -> mmap.mmap:
    """Worker side: the mapping of the slab behind ``fd``, made once per slab.

    A fresh mapping would fault every page again inside the writer's ``write()`` calls (about 0.3 s per
    GiB, measured). A mapping keeps its slab's pages alive after the trainer's pool frees the slab, so only the
    _WORKER_MAPS_KEPT most recently used are kept (an evicted one is unmapped once no tensor uses it); a mapped memfd
    keeps its inode, so a key is never reused while its mapping is kept.
    """
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino, nbytes)
    pages = _WORKER_SLAB_MAPS.pop(key, None) or mmap.mmap(fd, nbytes)
    _WORKER_SLAB_MAPS[key] = pages  # most recently used last
    _LANDING[torch.frombuffer(pages, dtype=torch.uint8, count=1).data_ptr()] = (pages, nbytes)
    while len(_WORKER_SLAB_MAPS) > _WORKER_MAPS_KEPT:
        evicted = _WORKER_SLAB_MAPS.pop(next(iter(_WORKER_SLAB_MAPS)))
        for base, (mapped, _) in list(_LANDING.items()):
            if mapped is evicted:
                del _LANDING[base]
    return pages


_LANDING: dict[int, tuple[mmap.mmap, int]] = {}  # worker side: a kept mapping's address -> (mapping, its size)


def waits_for_landing(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark an ``async_fn`` that calls ``wait_landed`` on each tensor before reading it: the worker runs it as soon
    as the request arrives, while the trainer still copies (module docstring)."""
    fn._waits_for_landing = True  # type: ignore[attr-defined]
    return fn


def _marked_waits(fn: Callable[..., Any]) -> bool:
    return bool(getattr(getattr(fn, "func", fn), "_waits_for_landing", False))


def wait_landed(t: torch.Tensor, timeout: float = LANDING_TIMEOUT_S) -> None:
    """Worker side: return once the bytes of ``t`` have landed in its slab (at once for a tensor in no slab);
    RuntimeError if the trainer's copy failed, TimeoutError after ``timeout`` seconds without them."""
    storage = t.untyped_storage()
    start = storage.data_ptr()
    found = next(((b, p, n) for b, (p, n) in _LANDING.items() if b <= start < b + n), None)
    if found is None:
        return
    base, pages, nbytes = found
    need = start + storage.nbytes() - base
    deadline, delay = time.monotonic() + timeout, 1e-5
    while True:
        (landed,) = _PROGRESS.unpack_from(pages, nbytes - _PROGRESS.size)
        if landed == COPY_FAILED:
            raise RuntimeError("the trainer's copy of the snapshot into the staging slab failed")
        if landed >= need:
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"the snapshot's bytes did not land in the staging slab within {timeout:g} s")
        time.sleep(delay)
        delay = min(2 * delay, 1e-3)


def wait_all_landed(fn: Callable[..., Any], args: Any) -> None:
    """Worker side, before ``fn(*args...)``: unless ``fn`` is marked ``waits_for_landing``, wait for every tensor
    reachable in ``args`` (``wait_landed``)."""
    if not _marked_waits(fn):
        map_tensors(wait_landed, args)


def unstage(request: AsyncRequest, slab_ref: tuple[int, int] | None) -> AsyncRequest:
    """Worker side: map the request's slab and turn placeholders back into tensors.

    Each tensor gets its own storage over the shared pages (no copy), so torch.save writes
    exactly what it would for the trainer's tensors. Equal placeholders give the same tensor.
    """
    if slab_ref is None:
        return request
    fd, nbytes = slab_ref  # received for this request: closed here once mapped
    try:
        pages = map_slab(fd, nbytes)
    finally:
        os.close(fd)
    tensors: dict[int, torch.Tensor] = {}

    def rebuild(x: Any) -> Any:
        if not isinstance(x, Staged):
            return x
        if x.offset not in tensors:
            flat = torch.frombuffer(pages, dtype=x.dtype, count=x.numel, offset=x.offset)
            tensors[x.offset] = flat.as_strided(x.shape, x.stride)
        return tensors[x.offset]

    args, kwargs = tree_map(rebuild, (request.async_fn_args, request.async_fn_kwargs or {}))
    return request._replace(async_fn_args=args, async_fn_kwargs=kwargs)
