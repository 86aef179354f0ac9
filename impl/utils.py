"""Small helpers shared by the async checkpoint modules.

* ``tree_map`` rebuilds nested dicts, lists and tuples with ``fn`` applied to every
  other value. Dict and tuple types are kept (an ``OrderedDict`` state dict stays one,
  including its ``_metadata`` attribute; named tuples stay named tuples).
* ``picklable_error`` turns an exception into one that survives a pickle round trip,
  so it can cross a process boundary or go through ``all_gather_object``.
* ``dist_ready`` / ``dist_rank``: the "world" is ``torch.distributed`` when it is initialized,
  otherwise this process alone (rank 0).
"""

import copy
import pickle
import traceback
from typing import Any, Callable

import torch.distributed as dist

__all__ = ["tree_map", "picklable_error", "dist_ready", "dist_rank"]


def dist_ready() -> bool:
    """True when torch.distributed is initialized (collectives are possible)."""
    return dist.is_available() and dist.is_initialized()


def dist_rank() -> int:
    """This process's rank, 0 outside torch.distributed."""
    return dist.get_rank() if dist_ready() else 0


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
        return obj._make(values) if hasattr(obj, "_fields") else type(obj)(values)
    return fn(obj)


def picklable_error(exc: BaseException) -> BaseException:
    """Return ``exc`` if it round-trips through pickle, else a RuntimeError describing it."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        trace = "".join(traceback.format_exception(exc))
        return RuntimeError(f"{exc!r} (original exception could not be pickled)\n{trace}")
