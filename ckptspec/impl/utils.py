"""Small helpers shared by the async and local checkpoint modules.

* ``tree_map`` rebuilds nested dicts, lists and tuples with ``fn`` applied to every
  other value. Dict and tuple types are kept (an ``OrderedDict`` state dict stays one,
  including its ``_metadata`` attribute; named tuples stay named tuples).
* ``picklable_error`` turns an exception into one that survives a pickle round trip,
  so it can cross a process boundary or go through ``all_gather_object``.
* ``dist_ready`` / ``dist_rank``: the "world" is ``torch.distributed`` when it is initialized,
  otherwise this process alone (rank 0).
* ``collective_device``, ``all_reduce`` and ``all_gather``: the collectives every module uses,
  on the device the group's backend needs (the current GPU for NCCL, the CPU otherwise).
* ``errors_by_rank``: which ranks of a gathered list reported an error.
* ``paused_gc``: automatic garbage collection off for a block (a save's calls, the worker's request).

NVRx's public helpers of this module, with their meaning: ``diff``, ``dict_list_map_outplace`` and
``preload_tensors`` (``ckptspec.impl.dict_utils``), ``logger_stack``, ``debug_time``, ``debug_msg`` and ``fallback_logger``
(``ckptspec.impl.debug_log``), ``wrap_for_async(fn)`` (``fn`` run with the garbage collector disabled; it returns None) and
the type variables ``U`` and ``V``.
"""

from __future__ import annotations

import copy
import functools
import gc
import os
import pickle
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any, TypeVar

import torch
import torch.distributed as dist

from .debug_log import debug_msg, debug_time, fallback_logger, logger_stack
from .dict_utils import dict_list_map_outplace, diff, preload_tensors

__all__ = [
    "U",
    "V",
    "all_gather",
    "all_reduce",
    "collective_device",
    "debug_msg",
    "debug_time",
    "dict_list_map_outplace",
    "diff",
    "dist_rank",
    "dist_ready",
    "errors_by_rank",
    "fallback_logger",
    "logger_stack",
    "paused_gc",
    "picklable_error",
    "preload_tensors",
    "tree_map",
    "wrap_for_async",
]

U = TypeVar("U")
V = TypeVar("V")


def wrap_for_async(fn: Callable[..., object]) -> Callable[..., None]:
    """``fn`` run with the garbage collector disabled (if it was enabled, it is enabled again after); the wrapper
    takes ``fn``'s arguments and returns None."""

    @functools.wraps(fn)
    def wrapped(*args: Any, **kwargs: Any) -> None:
        with paused_gc():
            fn(*args, **kwargs)

    return wrapped


# Reentrant: a signal handler that saves (a save on SIGTERM) runs in the thread it interrupts, maybe while that
# thread holds the lock.
_gc_lock = threading.RLock()
_gc_pausers = 0  # blocks inside paused_gc, in every thread
_gc_was_enabled = False  # whether the first of them found collection on


def _new_gc_lock() -> None:
    # A child forked while another thread held the lock would wait for it forever. The child keeps the count: one
    # forked inside a paused block (a temporal caller's writer) runs with collection off, as NVRx's writer does.
    global _gc_lock
    _gc_lock = threading.RLock()


os.register_at_fork(after_in_child=_new_gc_lock)


@contextmanager
def paused_gc() -> Iterator[None]:
    """Automatic garbage collection off for the block, as it was before once the last such block of any thread
    ends (blocks nest and overlap across threads). Also a decorator (``@paused_gc()``).

    Why: a save of 10,000 tensors makes and drops some 100,000 objects in the trainer's calls. With collection on,
    the collections run inside those calls and move the objects still alive to the oldest generation, so a full
    collection (0.4-0.5 s for the 700,000 objects such a trainer holds, on the 2-core machine) runs after every one
    or two saves. Paused, the objects a call drops are freed before any collection sees them; those it keeps are
    collected as usual afterwards. NVRx's writer and torch's ``get_state_dict`` pause it for the same reason.
    """
    global _gc_pausers, _gc_was_enabled
    # The steps are ordered so that a block entered between any two of them (a signal handler's) leaves the state
    # right: the flag is read before collection is turned off, and the outer block's flag is kept in a local.
    with _gc_lock:
        if _gc_pausers == 0:
            _gc_was_enabled = gc.isenabled()
        _gc_pausers += 1
        gc.disable()
    try:
        yield
    finally:
        with _gc_lock:
            enable = _gc_was_enabled
            _gc_pausers -= 1
            if _gc_pausers == 0 and enable:
                gc.enable()


def dist_ready() -> bool:
    """True when torch.distributed is initialized (collectives are possible)."""
    return dist.is_available() and dist.is_initialized()


def dist_rank() -> int:
    """This process's rank, 0 outside torch.distributed."""
    return dist.get_rank() if dist_ready() else 0


def collective_device(group: dist.ProcessGroup | None = None) -> torch.device:
    """Device for the tensors of a collective over ``group``: the current GPU under NCCL, else the CPU."""
    if dist.get_backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce(
    values: list[int],
    op: dist.ReduceOp.RedOpType,
    dtype: torch.dtype = torch.int32,
    group: dist.ProcessGroup | None = None,
) -> list[int]:
    """Collective: ``values`` reduced elementwise with ``op`` over ``group``, in one all-reduce.

    Under NCCL the values travel on the current GPU, on a side stream of their own: the collective then waits for
    no kernel the trainer has queued, and reading the result back waits for the collective alone, not for the
    training step in flight (the queue's polls run every step; each would otherwise drain the GPU's queue)."""
    device = collective_device(group)
    side = _flag_stream(device) if device.type == "cuda" else None
    with torch.cuda.stream(side) if side is not None else nullcontext():
        tensor = torch.tensor(values, dtype=dtype, device=device)
        dist.all_reduce(tensor, op=op, group=group)
        return tensor.tolist()


_FLAG_STREAMS: dict[torch.device, Any] = {}


def _flag_stream(device: torch.device) -> Any:
    """The side stream ``all_reduce`` uses on ``device`` (one per device, kept)."""
    stream = _FLAG_STREAMS.get(device)
    if stream is None:
        stream = _FLAG_STREAMS[device] = torch.cuda.Stream(device)
    return stream


def all_gather(obj: Any) -> list[Any]:
    """Collective: every rank's ``obj``, in rank order; ``[obj]`` outside torch.distributed."""
    if not dist_ready():
        return [obj]
    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def errors_by_rank(errors: Sequence[Any]) -> dict[int, Any]:
    """``{rank: error}`` for each entry of ``errors`` (one per rank) that is not None."""
    return {rank: err for rank, err in enumerate(errors) if err is not None}


def tree_map(fn: Callable[[Any], Any], obj: Any) -> Any:
    """Return a copy of ``obj`` with ``fn`` applied to each non-container leaf."""
    if isinstance(obj, dict):
        # copy.copy keeps the mapping type and instance attributes; values are replaced below.
        out = copy.copy(obj)
        for key, value in obj.items():
            out[key] = tree_map(fn, value)
        return out
    if isinstance(obj, list):
        return [tree_map(fn, value) for value in obj]
    if isinstance(obj, tuple):
        values = [tree_map(fn, value) for value in obj]
        if type(obj) is tuple:
            return tuple(values)
        if hasattr(obj, "_fields"):  # a NamedTuple: built from its fields, not from one iterable
            named: Any = obj
            return named._make(values)
        return type(obj)(values)
    return fn(obj)


def picklable_error(exc: BaseException) -> BaseException:
    """Return ``exc`` if it round-trips through pickle, else a RuntimeError describing it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        trace = "".join(traceback.format_exception(exc))
        return RuntimeError(f"{exc!r} (original exception could not be pickled)\n{trace}")
