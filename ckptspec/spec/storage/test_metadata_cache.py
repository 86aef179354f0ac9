"""The metadata cache: plans reused while the structure holds, re-planned as soon as it changes anywhere."""

import os
from dataclasses import dataclass, field, replace
from typing import Any

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.filesystem import _StoragePrefix
from torch.distributed.checkpoint.utils import _DistWrapper

from ckptspec.spec.drivers import saving
from ckptspec.spec.harness import strategies
from ckptspec.spec.harness.asserts import assert_each_rank, assert_state_dict_equal
from ckptspec.spec.harness.ranks import ranks, world
from ckptspec.spec.harness.shared_runs import shared

pytestmark = pytest.mark.needs("storage_writer", "persistent_caller")
OBJECT_COLLECTIVES = ("gather_object", "scatter_object_list", "all_gather_object", "broadcast_object_list")


class _ObjectCollectiveCounter:
    """Counts calls of torch.distributed's object collectives (how plans are exchanged) while active."""

    def __enter__(self):
        self.calls, self._real = [], {name: getattr(dist, name) for name in OBJECT_COLLECTIVES}
        for name, fn in self._real.items():
            setattr(dist, name, self._counting(name, fn))
        return self

    def _counting(self, name, fn):
        def call(*args, **kwargs):
            self.calls.append(name)
            return fn(*args, **kwargs)

        return call

    def __exit__(self, *exc):
        for name, fn in self._real.items():
            setattr(dist, name, fn)


def _cached_save(state_dict, path, cache, planner=None, persistent=True):
    """One save with enable_cache=True; returns the object collectives its planning made.

    The persistent caller by default: the clauses here are about planning, which either caller shares (the
    temporal caller's own hazard, a child stuck in its fork, is TC-3's)."""
    writer = saving.module("filesystem_async").FileSystemWriterAsync(path)
    plan_kwargs = {"enable_cache": True, "metadata_cache": cache, "planner": planner}
    with _ObjectCollectiveCounter() as counter:
        ret = saving.plan(state_dict, writer, **plan_kwargs)
    req = saving.request(writer, ret)
    if persistent is None:
        req.execute_sync()
    else:
        q = saving.queue(persistent)
        q.schedule_async_request(req)
        saving.finalize(q)
    return counter.calls


@dataclass(frozen=True)
class CachedSave:
    """One save with enable_cache=True, on one rank."""

    path: str
    state: dict = field(compare=False, repr=False)  # what the rank saved
    status: tuple | None = None  # get_metadata_caching_status() afterwards
    exchanged: list = field(default_factory=list)  # the object collectives its planning made


def _base_state(rank):
    return {f"rank{rank}": {"w": torch.randn(4), "b": torch.zeros(2, 3), "i": torch.arange(rank + 2)}, "step": 0}


def _unchanged(tmp, n):
    rank, _ = world()
    cache = saving.module("state_dict_saver").CheckpointMetadataCache()
    state, outcomes = _base_state(rank), []
    for k in range(n):
        strategies.mutate_in_place(state)
        state["step"] = k
        path = os.path.join(tmp, f"ckpt{k}")
        exchanged = _cached_save(state, path, cache)
        outcomes.append(
            CachedSave(path, strategies.private_copy(state), cache.get_metadata_caching_status(), exchanged)
        )
    return outcomes


def _union(states):
    merged = {}
    for state in states:
        merged.update(state)
    return merged


@pytest.mark.spec("SD-3", "SD-5")
def test_an_unchanged_structure_reuses_the_plan_and_saves_current_values(rank_pool, tmp_path):
    results = rank_pool(2).run(_unchanged, str(tmp_path), 4)
    for k in range(4):
        expected = _union(r[k].state for r in results)
        assert_state_dict_equal(
            saving.load(expected, results[0][k].path), expected, call=f"dcp.load of cached save {k}"
        )
        assert_each_rank(
            f"save {k}: status",
            [r[k].status for r in results],
            (k > 0, False),
            call="get_metadata_caching_status() of an unchanged structure",
        )
        if k >= 2:
            assert_each_rank(
                f"save {k}: exchanged",
                [r[k].exchanged for r in results],
                [],
                call="object collectives of planning an unchanged structure (plans should be reused)",
            )


def _change(state, rank, kind):
    own = state[f"rank{rank}"]
    if kind == "add":
        own["new"] = torch.ones(2)
    elif kind == "remove":
        del own["b"]
    elif kind == "shape":
        own["w"] = torch.randn(own["w"].numel() + 1)
    else:
        own["w"] = own["w"].to(torch.float64)


def _changed(tmp, kind, changer, read_status):
    """Rank body: five cached saves, the structure changed on rank `changer` at save 3; each save's state and,
    with read_status, the caching status after it."""
    rank, _ = world()
    cache = saving.module("state_dict_saver").CheckpointMetadataCache()
    state, outcomes = _base_state(rank), []
    for k in range(5):
        strategies.mutate_in_place(state)
        if k == 3 and rank == changer:
            _change(state, rank, kind)
        path = os.path.join(tmp, f"ckpt{k}")
        _cached_save(state, path, cache)
        status = cache.get_metadata_caching_status() if read_status else None
        outcomes.append(CachedSave(path, strategies.private_copy(state), status))
    return outcomes


CHANGERS = pytest.mark.parametrize("changer", [0, 1], ids=["coordinator-changes", "other-rank-changes"])


@pytest.mark.spec("SD-4")
@CHANGERS
@pytest.mark.parametrize("kind", ["add", "remove", "shape", "dtype"])
def test_a_structure_change_on_any_rank_is_planned_afresh(rank_pool, tmp_path_factory, kind, changer):
    # Judged by what loads back only: the caching status is SD-5's (the next test).
    results = _changed_run(rank_pool, tmp_path_factory, kind, changer)
    for k in range(5):
        expected = _union(r[k].state for r in results)
        assert_state_dict_equal(
            saving.load(expected, results[0][k].path),
            expected,
            call=f"dcp.load of save {k} ({kind} on rank {changer} at save 3)",
        )


def _changed_run(rank_pool, tmp_path_factory, kind, changer):
    """SD-4's run (`_changed` on 2 ranks, no status read), made once per session for SD-4 and SD-4w."""
    return shared(
        tmp_path_factory,
        f"SD-4-{kind}-{changer}",
        lambda: rank_pool(2).run(_changed, str(tmp_path_factory.mktemp("sd4")), kind, changer, False),
    )


def _kept_structure(state, base):
    """The entries of `state` that `base` (the first save's state) holds with the same shape and dtype."""
    if isinstance(state, dict):
        return {k: _kept_structure(v, base[k]) for k, v in state.items() if k in base and _same(v, base[k])}
    return state


def _same(value, base):
    if isinstance(value, torch.Tensor):
        return isinstance(base, torch.Tensor) and (value.shape, value.dtype) == (base.shape, base.dtype)
    return isinstance(value, dict) == isinstance(base, dict)


@pytest.mark.spec("SD-4w")
@CHANGERS
@pytest.mark.parametrize("kind", ["add", "remove", "shape", "dtype"])
def test_after_a_structure_change_the_unchanged_entries_keep_their_values(rank_pool, tmp_path_factory, kind, changer):
    results = _changed_run(rank_pool, tmp_path_factory, kind, changer)
    base = _union(r[0].state for r in results)
    for k in range(5):
        expected = _kept_structure(_union(r[k].state for r in results), base)
        assert_state_dict_equal(
            saving.load(expected, results[0][k].path),
            expected,
            call=f"dcp.load of the entries whose structure did not change, save {k} ({kind} on rank {changer} at save 3)",
        )


@pytest.mark.spec("SD-5")
@CHANGERS
@pytest.mark.parametrize("kind", ["add", "dtype"])
def test_the_caching_status_shows_a_structure_change(rank_pool, tmp_path, kind, changer):
    # A key added and a dtype changed: one change of the key set, one of a tensor's metadata.
    results = rank_pool(2).run(_changed, str(tmp_path), kind, changer, True)
    for k in range(5):
        assert_each_rank(
            f"save {k}: status",
            [r[k].status for r in results],
            (k not in (0, 3), False),
            call=f"get_metadata_caching_status(), {kind} on rank {changer} at save 3",
        )


@pytest.mark.spec("SD-6", "SD-5")
@ranks(1, timeout=90)
def test_enable_cache_without_a_cache_uses_the_module_cache(tmp_path):
    sds = saving.module("state_dict_saver")
    assert sds.get_metadata_caching_status() is None, "a fresh process reports a caching status before any cache"
    state = {"w": torch.zeros(3)}
    statuses = []
    for k in range(2):
        saving.async_save(state, str(tmp_path / f"ckpt{k}"), persistent=None, plan_kwargs={"enable_cache": True})
        statuses.append(sds.get_metadata_caching_status())
    assert statuses == [(False, False), (True, False)], (
        f"with enable_cache=True and no metadata_cache, the module status after two saves was {statuses}, "
        "but should be [(False, False), (True, False)]"
    )


def _local_plan(state, rank):
    planner = saving.DecentralizedPlanner()
    planner.set_up_planner(state, is_coordinator=rank == 0)
    return planner.create_local_plan()


def _verify():
    rank, size = world()
    sds = saving.module("state_dict_saver")
    wrapper = _DistWrapper(None, True, 0)
    own = _local_plan({f"rank{rank}": torch.zeros(rank + 1), "shared": torch.ones(2)}, rank)
    plans: list[Any] = [None] * size  # all_gather_object fills in every rank's plan
    dist.all_gather_object(plans, own)
    moved = [replace(p, storage_data=_StoragePrefix(f"__{i + size}_")) for i, p in enumerate(plans)]
    changed = _local_plan({"different": torch.zeros(5)}, rank) if rank == size - 1 else own
    return {
        "no loaded plans": sds.verify_global_md_reuse(None, own, rank, wrapper),
        "one plan too few": sds.verify_global_md_reuse(plans[:-1], own, rank, wrapper),
        "same plans": sds.verify_global_md_reuse(plans, own, rank, wrapper),
        "other storage_data": sds.verify_global_md_reuse(moved, own, rank, wrapper),
        "last rank's plan differs": sds.verify_global_md_reuse(plans, changed, rank, wrapper),
    }


@pytest.mark.spec("SD-7")
def test_verify_global_md_reuse_agrees_on_every_rank(rank_pool):
    results = rank_pool(2).run(_verify)
    want = {
        "no loaded plans": False,
        "one plan too few": False,
        "same plans": True,
        "other storage_data": True,
        "last rank's plan differs": False,
    }
    assert_each_rank("verify_global_md_reuse", results, want)


def _decentralized(path):
    rank, _ = world()
    state = _base_state(rank)
    saving.async_save(state, path, plan_kwargs={"planner": saving.DecentralizedPlanner()})
    return state


@pytest.mark.spec("SD-9")
def test_decentralized_planning_records_every_local_plan(rank_pool, tmp_path):
    path = str(tmp_path / "ckpt")
    states = rank_pool(2).run(_decentralized, path)
    plans = getattr(saving.read_metadata(path), "all_local_plans", None)
    assert plans is not None, f"the metadata's all_local_plans is {plans}, not one plan per rank"
    assert len(plans) == 2, f"the metadata's all_local_plans is {plans}, not one plan per rank"
    expected = _union(states)
    assert_state_dict_equal(saving.load(expected, path), expected, call="dcp.load of a decentralized save")


@pytest.mark.spec("SD-8", "SD-5")
@ranks(2, timeout=120)
def test_metadata_loaded_from_a_previous_checkpoint_is_reused(tmp_path):
    rank, _ = world()
    sds = saving.module("state_dict_saver")
    state = _base_state(rank)
    first = str(tmp_path / "first")
    saving.async_save(state, first, persistent=None, plan_kwargs={"planner": saving.DecentralizedPlanner()})
    dist.barrier()  # the coordinator may still be committing .metadata
    sds.init_checkpoint_metadata_cache(saving.read_metadata(first))
    strategies.mutate_in_place(state)
    same = str(tmp_path / "same")
    exchanged = _cached_save(state, same, None, saving.DecentralizedPlanner(), persistent=None)
    # NVRx 0.7.0 removed get_metadata_caching_status (SD-5's API-changed entry): there the plans exchanged and
    # the loads below judge SD-8.
    status = getattr(sds, "get_metadata_caching_status", None)
    if status is not None:
        assert status() == (False, True), f"status after reusing loaded metadata is {status()}, not (False, True)"
    assert "gather_object" not in exchanged, (
        f"planning gathered the local plans ({exchanged}) although they were verified"
    )
    dist.barrier()
    assert_state_dict_equal(saving.load(state, same), state, call="dcp.load of a save reusing loaded metadata")
    if rank == 1:
        state["rank1"]["extra"] = torch.ones(1)
    sds.init_checkpoint_metadata_cache(saving.read_metadata(first))
    changed = str(tmp_path / "changed")
    _cached_save(state, changed, None, saving.DecentralizedPlanner(), persistent=None)
    if status is not None:
        assert status()[1] is False, "loaded metadata was reused for a different structure"
    dist.barrier()
    assert_state_dict_equal(saving.load(state, changed), state, call="dcp.load after the structure changed")


@pytest.mark.spec("SD-8w")
@ranks(2, timeout=120)
def test_after_loaded_metadata_a_changed_structure_keeps_the_unchanged_entries(tmp_path):
    rank, _ = world()
    sds = saving.module("state_dict_saver")
    state = _base_state(rank)
    first = str(tmp_path / "first")
    saving.async_save(state, first, persistent=None, plan_kwargs={"planner": saving.DecentralizedPlanner()})
    dist.barrier()  # the coordinator may still be committing .metadata
    sds.init_checkpoint_metadata_cache(saving.read_metadata(first))
    strategies.mutate_in_place(state)
    _cached_save(state, str(tmp_path / "same"), None, saving.DecentralizedPlanner(), persistent=None)
    kept = strategies.private_copy(state)
    if rank == 1:
        state["rank1"]["extra"] = torch.ones(1)
    sds.init_checkpoint_metadata_cache(saving.read_metadata(first))
    changed = str(tmp_path / "changed")
    _cached_save(state, changed, None, saving.DecentralizedPlanner(), persistent=None)
    dist.barrier()
    assert_state_dict_equal(
        saving.load(kept, changed), kept, call="dcp.load of the unchanged entries after rank 1 added one"
    )
