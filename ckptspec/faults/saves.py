"""Two ways to save a checkpoint through the target's async core, each with a commit marker.

- `CoreSave` (every target): each rank's async_fn writes its shard `shard<rank>.pt` (temporary file,
  fsync, rename); a finalize function, which runs only once every rank's call is done, has rank 0
  write the commit marker `COMMIT`. It exercises the async core alone (Megatron-Core has no more).
- `DcpSave` (targets with `storage_writer`): the recipe of the NVRx guide (000), as ckptspec.spec.harness.surface.recipe
  writes it, with each phase's part wrapped in its hook; the commit marker is DCP's `.metadata`, written by the
  coordinator.

Each rank saves its own keys (`expected(rank, version)`), so a checkpoint is complete only with every
rank's data. `committed(path)` says whether the commit marker exists; `assert_loads` reads the
checkpoint back outside the ranks (stock torch.load / torch.distributed.checkpoint.load, no process
group) and compares every rank's data exactly. The hooks (ckptspec.spec.drivers.faults.phases.Hooks) place a
fault in the plan, staging (preload_fn), write (async_fn) or finalize phase.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from ckptspec.spec.drivers.faults.phases import Hooks, in_phase
from ckptspec.spec.drivers.saving import template
from ckptspec.spec.drivers.states import assert_loads, rank_state, whole_state
from ckptspec.spec.harness import assert_state_dict_equal
from ckptspec.spec.harness.surface.formats import DCP
from ckptspec.spec.harness.surface.recipe import plan_async_save, recipe_modules

__all__ = ["CoreSave", "DcpSave", "expected", "for_target"]

NO_HOOKS = Hooks()


SHAPE: dict[str, Any] = {"shape": (3, 4), "per_version": 100}
"""The fault saves' states: rank_state's tensor as a 3x4 matrix, 100 apart from one version to the next."""


def expected(rank: int, version: int) -> dict[str, Any]:
    """The state dict rank `rank` saves as checkpoint `version` (ckptspec.spec.drivers.states.rank_state)."""
    return rank_state(rank, version, **SHAPE)


def _clone(state):
    if isinstance(state, torch.Tensor):
        return state.clone()
    if isinstance(state, dict):
        return {k: _clone(v) for k, v in state.items()}
    return state


def _same(value):
    return value


def _fsynced_replace(data_writer, path: str) -> None:
    """Write path through a temporary file: write, fsync, rename (the commit idiom of DCP)."""
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        data_writer(f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_shard(path: str, state: dict, rank: int) -> None:
    """CoreSave's async_fn: this rank's shard, made visible by a rename once complete."""
    os.makedirs(path, exist_ok=True)
    _fsynced_replace(lambda f: torch.save(state, f), os.path.join(path, f"shard{rank}.pt"))


def commit(path: str, rank: int, world_size: int) -> None:
    """CoreSave's finalize function: rank 0 writes the commit marker."""
    if rank == 0:
        _fsynced_replace(lambda f: f.write(str(world_size).encode()), os.path.join(path, CoreSave.MARKER))


class _Save:
    name = ""
    MARKER = ""

    def __init__(self, target):
        self.core = target.module("async_ckpt.core")

    def request(self, path: str, version: int, rank: int, world_size: int, hooks: Hooks = NO_HOOKS):
        raise NotImplementedError

    def save(self, queue, path: str, version: int, rank: int, world_size: int, hooks: Hooks = NO_HOOKS):
        """Plan, schedule and finalize (blocking) one checkpoint; return what finalize returned."""
        queue.schedule_async_request(self.request(path, version, rank, world_size, hooks))
        return queue.maybe_finalize_async_calls(blocking=True, no_dist=False)

    def committed(self, path: str) -> bool:
        """Whether the commit marker exists (local paths; see test_object_store_faults for S3)."""
        return os.path.exists(os.path.join(path, self.MARKER))

    def assert_loads(self, path: str, version: int, world_size: int) -> None:
        raise NotImplementedError


class CoreSave(_Save):
    """Shards written by async_fn, commit marker written in finalize (see the module docstring)."""

    name = "core"
    MARKER = "COMMIT"

    def request(self, path, version, rank, world_size, hooks=NO_HOOKS):
        state = expected(rank, version)
        return self.core.AsyncRequest(
            functools.partial(in_phase, hooks.write, write_shard),
            (path, None, rank),
            [functools.partial(in_phase, hooks.finalize, commit, path, rank, world_size)],
            preload_fn=functools.partial(in_phase, hooks.staging, _clone, state),
        )

    def assert_loads(self, path, version, world_size):
        for rank in range(world_size):
            shard = torch.load(os.path.join(path, f"shard{rank}.pt"), weights_only=False)
            assert_state_dict_equal(shard, expected(rank, version), call=f"torch.load of {path} shard {rank}")


class DcpSave(_Save):
    """The NVRx guide's DCP recipe (see the module docstring)."""

    name = "dcp"
    MARKER = ".metadata"

    def __init__(self, target, use_msc: bool = False):
        super().__init__(target)
        self.modules = recipe_modules(target)
        self.use_msc = use_msc

    def _plan(self, path, state):
        extra: dict[str, Any] = {"use_msc": True} if self.use_msc else {}
        return plan_async_save(self.modules, state, path, thread_count=1, **extra)

    def request(self, path, version, rank, world_size, hooks=NO_HOOKS):
        planned = hooks.plan.run(self._plan, path, expected(rank, version))
        preload_fn = planned.preload_fn
        if preload_fn is None and hooks.staging != NO_HOOKS.staging:
            # A writer that stages nothing (CPU tensors) gets a staging phase that changes nothing.
            preload_fn = functools.partial(_same, planned.save_args[1])
        if preload_fn is not None:
            preload_fn = functools.partial(in_phase, hooks.staging, preload_fn)
        return planned.but(
            save_fn=functools.partial(in_phase, hooks.write, planned.save_fn),
            preload_fn=preload_fn,
            finalize_fn=functools.partial(in_phase, hooks.finalize, planned.finalize_fn),
        ).request()

    def assert_loads(self, path, version, world_size):
        import torch.distributed.checkpoint as dcp

        want = whole_state(world_size, version, **SHAPE)
        if not self.use_msc:
            assert_loads(path, want, fmt=DCP)
            return
        import multistorageclient as msc

        loaded = template(want)
        dcp.load(loaded, storage_reader=msc.torch.MultiStorageFileSystemReader(path), no_dist=True)
        assert_state_dict_equal(loaded, want, call=f"torch.distributed.checkpoint.load of {path}")


def for_target(target) -> _Save:
    """DcpSave where the target has a storage writer, else CoreSave."""
    return DcpSave(target) if target.has("storage_writer") else CoreSave(target)
