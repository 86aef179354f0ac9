"""How the storage tests save and load: the documented async recipe, stock DCP loading, and checkpoint inspection.

Every helper reaches the target only through its documented module paths (`async_ckpt.core`,
`async_ckpt.filesystem_async`, `async_ckpt.state_dict_saver`), and saves through the one recipe of
ckptspec.spec.harness.surface.recipe; loading and inspection use stock `torch.distributed.checkpoint`, never the target.
"""

from __future__ import annotations

import functools
import os
from multiprocessing import util as mp_util
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from ckptspec.spec.harness import workloads
from ckptspec.spec.harness.asserts import assert_state_dict_equal, bounded
from ckptspec.spec.harness.ranks import rank_state
from ckptspec.spec.harness.surface.loading import current_target
from ckptspec.spec.harness.surface.recipe import plan_async_save, planned_save, recipe_modules

__all__ = [
    "FINALIZE_BOUND",
    "DecentralizedPlanner",
    "async_save",
    "data_files",
    "finalize",
    "load",
    "mismatch",
    "module",
    "plan",
    "queue",
    "read_metadata",
    "request",
    "save_with",
    "template",
    "tree",
]

FINALIZE_BOUND = 90.0
"""Seconds a blocking finalization of a small checkpoint may take: generous, since it may include starting a
worker (or, for some targets, a multiprocessing manager) on a loaded CI machine; it only has to catch hangs."""


def module(name: str) -> Any:
    """The target's `async_ckpt.<name>` module."""
    return current_target().module(f"async_ckpt.{name}")


class DecentralizedPlanner(DefaultSavePlanner):
    """The stock planner, marked able to make its global plan without the other ranks (as Megatron's is)."""

    can_run_decentralized_global_plan = True

    def create_decentralized_global_plan(self, local_plan: Any) -> Any:
        return local_plan


def queue(persistent: bool) -> Any:
    """The rank's AsyncCallsQueue, kept for the rank's lifetime so its worker stays warm across examples.

    One per MSC_CONFIG value, since a worker keeps the environment it started with. It is closed when the
    rank exits: a forked rank does not run the exit hooks its parent registered.
    """
    key = ("storage-queue", current_target().name, persistent, os.environ.get("MSC_CONFIG"))
    if key not in rank_state:
        rank_state[key] = module("core").AsyncCallsQueue(persistent=persistent)
        mp_util.Finalize(rank_state[key], rank_state[key].close, exitpriority=10)
    return rank_state[key]


def plan(state_dict: dict[str, Any], writer: Any, **kwargs: Any) -> Any:
    """save_state_dict_async_plan(state_dict, writer, **kwargs)."""
    return module("state_dict_saver").save_state_dict_async_plan(state_dict, writer, **kwargs)


def request(writer: Any, plan_ret: Any, gate: str | None = None) -> Any:
    """The seed-000 AsyncRequest: the writer's save function, finalized by save_state_dict_async_finalize.

    With `gate`, the save function waits for the gate file before writing.
    """
    planned = planned_save(recipe_modules(), writer, plan_ret)
    if gate is not None and planned.save_fn is not None:
        planned = planned.but(save_fn=functools.partial(workloads.call_when_open, gate, planned.save_fn))
    return planned.request()


def finalize(q: Any, bound: float = FINALIZE_BOUND) -> Any:
    return bounded(
        bound, "maybe_finalize_async_calls(blocking=True, no_dist=False)", q.maybe_finalize_async_calls, True, False
    )


def async_save(
    state_dict: dict[str, Any],
    path: str,
    *,
    persistent: bool | None = False,
    bound: float = FINALIZE_BOUND,
    plan_kwargs: dict[str, Any] | None = None,
    **writer_kwargs: Any,
) -> Any:
    """Plan, schedule on the rank's queue and finalize (blocking); `persistent=None` runs it with execute_sync.

    The temporal caller is the default: a fork costs far less than starting a persistent worker, and the
    storage clauses hold for either caller (tests of the persistent path ask for it).

    Returns the writer.
    """
    writer = module("filesystem_async").FileSystemWriterAsync(path, **writer_kwargs)
    return save_with(writer, state_dict, persistent=persistent, bound=bound, plan_kwargs=plan_kwargs)


def save_with(
    writer: Any,
    state_dict: dict[str, Any],
    *,
    persistent: bool | None = False,
    bound: float = FINALIZE_BOUND,
    plan_kwargs: dict[str, Any] | None = None,
) -> Any:
    """async_save with a writer the caller made."""
    req = plan_async_save(recipe_modules(), state_dict, writer=writer, planner=None, plan_kwargs=plan_kwargs).request()
    if persistent is None:
        bounded(bound, "AsyncRequest.execute_sync()", req.execute_sync)
    else:
        q = queue(persistent)
        q.schedule_async_request(req)
        finalize(q, bound)
    return writer


def template(obj: Any) -> Any:
    """A state dict of the same structure to load into: zeroed tensors, None for every other value."""
    if isinstance(obj, torch.Tensor):
        return torch.zeros_like(obj)
    if isinstance(obj, dict):
        return {k: template(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [template(v) for v in obj]
    return None


def load(expected: Any, path: str, reader: Any = None) -> Any:
    """Load the checkpoint at `path` with stock dcp.load (this process only) into template(expected)."""
    target = template(expected)
    dcp.load(target, storage_reader=reader if reader is not None else FileSystemReader(path), no_dist=True)
    return target


def mismatch(actual: Any, expected: Any, call: str) -> str | None:
    """assert_state_dict_equal's message, or None when equal: a rank returns it, so that a failing
    hypothesis example does not cost the warm ranks while hypothesis shrinks it."""
    try:
        assert_state_dict_equal(actual, expected, call=call)
    except AssertionError as exc:
        return str(exc)
    return None


def read_metadata(path: str) -> Any:
    return FileSystemReader(path).read_metadata()


def data_files(path: str) -> list[str]:
    return sorted(f for f in os.listdir(path) if f.endswith(".distcp"))


def tree(path: str) -> dict[str, bytes]:
    """Every file under `path` (relative name -> contents)."""
    out = {}
    for root, _, files in os.walk(path):
        for name in files:
            full = os.path.join(root, name)
            with open(full, "rb") as f:
                out[os.path.relpath(full, path)] = f.read()
    return out
