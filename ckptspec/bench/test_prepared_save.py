"""impl's prepared save (ckptspec/impl/async_ckpt/state_dict_saver.py, "prepared"): with `enable_cache=True`, a
repeated save of a state dict of the same structure skips the planner (no set-up, no local plan) and fills the
writer's buckets from the previous save's template. The contract no spec clause states (the metadata-cache
clauses of ckptspec/spec/storage/test_metadata_cache.py judge reuse through NVRx's API, and pass): a prepared save
writes exactly the files a save planned in full writes, with this save's values (tensors and other values);
any change the plan or its metadata depends on makes the save plan in full; a refused path or a value that
cannot be pickled fails as it does when planned in full."""

from __future__ import annotations

import os
import pickle
from typing import Any

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.checkpoint.api import CheckpointException

from ckptspec.spec.drivers import saving
from ckptspec.spec.harness import load_target
from ckptspec.spec.harness.surface.recipe import plan_async_save, recipe_modules

_IMPL = load_target("impl")
_MODULES = recipe_modules(_IMPL)
_SDS = _IMPL.module("async_ckpt.state_dict_saver")


class _CountingPlanner(DefaultSavePlanner):
    """torch's planner counting its local plans (a subclass: it never takes the prepared path itself)."""

    local_plans = 0

    def create_local_plan(self) -> Any:
        type(self).local_plans += 1
        return super().create_local_plan()


def _save(state: dict[str, Any], path: str, cache: Any, planner: Any = None) -> None:
    kwargs = {"enable_cache": cache is not None, "metadata_cache": cache}
    planned = plan_async_save(_MODULES, state, path, planner=planner or DefaultSavePlanner(), plan_kwargs=kwargs)
    planned.request().execute_sync()


def _planned_in_full(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts (in the list's one element) the saves that ran torch's local planning."""
    calls = [0]
    real = DefaultSavePlanner.create_local_plan

    def counting(self: Any) -> Any:
        calls[0] += 1
        return real(self)

    monkeypatch.setattr(DefaultSavePlanner, "create_local_plan", counting)
    return calls


def _state(seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "model": {"w": torch.randn(8, 4, generator=g), "b": torch.randn(4, generator=g), "ids": torch.arange(5)},
        "optim": {"state": [{"exp_avg": torch.randn(8, 4, generator=g)}], "lr": 0.1},
        "step": seed,
        "tag": ("run", seed),
    }


def _files(path: str) -> dict[str, bytes]:
    return {n: open(os.path.join(path, n), "rb").read() for n in sorted(os.listdir(path)) if n.endswith(".distcp")}


def _loaded(path: str, like: dict[str, Any]) -> dict[str, Any]:
    return saving.load(like, path)  # stock dcp.load, this process only


def test_a_repeated_save_is_prepared_and_writes_the_files_a_full_plan_writes(tmp_path, monkeypatch):
    full_plans = _planned_in_full(monkeypatch)
    cache = _SDS.CheckpointMetadataCache()
    state = _state(1)
    _save(state, str(tmp_path / "first"), cache)
    for t in (state["model"]["w"], state["optim"]["state"][0]["exp_avg"]):
        t.mul_(-2)  # the trainer's next step, in place
    state["step"], state["tag"] = 2, ("run", 2)
    _save(state, str(tmp_path / "prepared"), cache)
    assert full_plans[0] == 1, f"the repeated save planned in full ({full_plans[0]} local plans for two saves)"
    assert cache.get_metadata_caching_status()[0], "the prepared save does not report its plan reused"
    _save(state, str(tmp_path / "fresh"), None)  # no cache: planned in full
    assert _files(str(tmp_path / "prepared")) == _files(str(tmp_path / "fresh")), (
        "the prepared save's data files differ from those of a save of the same state planned in full"
    )
    loaded = _loaded(str(tmp_path / "prepared"), state)
    assert loaded["step"] == 2, "a non-tensor value of the prepared save is stale"
    assert loaded["tag"] == ("run", 2), "a non-tensor value of the prepared save is stale"
    torch.testing.assert_close(loaded["model"]["w"], state["model"]["w"])


def test_a_repeated_save_on_one_rank_plans_without_a_collective(tmp_path, monkeypatch, process_group):
    """With a group of one rank there is no other rank to agree with: the prepared save's planning makes no
    all-reduce (on gloo, about 0.25 ms of a 1 ms planning with few tensors)."""
    import torch.distributed as dist

    cache = _SDS.CheckpointMetadataCache()
    state = _state(1)
    _save(state, str(tmp_path / "first"), cache)
    calls: list[Any] = []
    real = dist.all_reduce

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(dist, "all_reduce", counted)
    writer = _MODULES.writers.FileSystemWriterAsync(str(tmp_path / "prepared"))
    _SDS.save_state_dict_async_plan(state, writer, enable_cache=True, metadata_cache=cache)
    assert cache.get_metadata_caching_status()[0], "the repeated save was not prepared"
    assert not calls, f"the prepared save's planning made {len(calls)} all-reduce(s) on a group of one rank"


def test_new_tensors_of_the_same_shapes_are_saved_from_the_new_state(tmp_path):
    cache = _SDS.CheckpointMetadataCache()
    _save(_state(1), str(tmp_path / "a"), cache)
    new = _state(7)  # other storages, same structure: prepared, with the new tensors' values
    _save(new, str(tmp_path / "b"), cache)
    assert cache.get_metadata_caching_status()[0], "a state dict of the same structure was planned in full"
    loaded = _loaded(str(tmp_path / "b"), new)
    torch.testing.assert_close(loaded["optim"]["state"][0]["exp_avg"], new["optim"]["state"][0]["exp_avg"])


def _change(state: dict[str, Any], change: str) -> None:
    model = state["model"]
    if change == "new key":
        model["extra"] = torch.ones(3)
    elif change == "removed key":
        del model["b"]
    elif change == "shape":
        model["b"] = torch.randn(5)
    elif change == "dtype":
        model["b"] = model["b"].double()
    elif change == "requires_grad":
        model["b"].requires_grad_(True)
    elif change == "tensor to value":
        model["ids"] = 5
    elif change == "value to tensor":
        state["step"] = torch.tensor(3)
    elif change == "value type":
        state["optim"]["lr"] = "0.1"
    elif change == "list length":
        state["optim"]["state"].append({"exp_avg": torch.zeros(1)})
    elif change == "renamed key":
        model["w2"] = model.pop("w")
    else:
        raise AssertionError(change)


_CHANGES = (
    "new key",
    "removed key",
    "shape",
    "dtype",
    "requires_grad",
    "tensor to value",
    "value to tensor",
    "value type",
    "list length",
    "renamed key",
)


@settings(max_examples=len(_CHANGES), deadline=None)
@given(change=st.sampled_from(_CHANGES))
@example(change="requires_grad")
def test_a_change_the_plan_depends_on_plans_in_full(tmp_path_factory, change):
    root = tmp_path_factory.mktemp("changed")
    cache = _SDS.CheckpointMetadataCache()
    state = _state(3)
    _save(state, str(root / "a"), cache)
    _change(state, change)
    with pytest.MonkeyPatch.context() as monkeypatch:
        full_plans = _planned_in_full(monkeypatch)
        _save(state, str(root / "b"), cache)
    assert full_plans[0] == 1, f"after a change ({change}) the save was prepared, not planned in full"
    loaded = _loaded(str(root / "b"), state)
    assert sorted(loaded) == sorted(state)
    assert pickle.dumps(_plain(loaded)) == pickle.dumps(_plain(state)), f"after a change ({change}) the values differ"


def _plain(obj: Any) -> Any:
    """Tensors as lists, so that equal state dicts pickle alike."""
    if isinstance(obj, torch.Tensor):
        return (str(obj.dtype), obj.detach().tolist())
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in sorted(obj.items())}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    return obj


def test_a_grad_requiring_tensor_is_written_detached_when_prepared(tmp_path):
    """The prepared path detaches only where the fingerprint says a tensor requires grad; it must still do so."""
    cache = _SDS.CheckpointMetadataCache()
    state = _state(2)
    state["model"]["w"] = torch.nn.Parameter(state["model"]["w"])
    _save(state, str(tmp_path / "full"), cache)
    planned = plan_async_save(
        _MODULES, state, str(tmp_path / "prepared"), plan_kwargs={"enable_cache": True, "metadata_cache": cache}
    )
    assert cache.get_metadata_caching_status()[0], "the repeated save was planned in full"
    written = [t for bucket in planned.writer.write_buckets for _, t in bucket.data[1]]
    assert written, "the prepared save hands the writer no tensor"
    assert not any(t.requires_grad for t in written), "a prepared save hands the writer a tensor requiring grad"
    planned.request().execute_sync()
    torch.testing.assert_close(_loaded(str(tmp_path / "prepared"), state)["model"]["w"], state["model"]["w"].detach())


def test_a_tensor_of_another_layout_in_a_container_of_tensors_plans_in_full(tmp_path, monkeypatch):
    cache = _SDS.CheckpointMetadataCache()
    state = {"model": {"w": torch.randn(4, 4), "b": torch.randn(4)}}
    _save(state, str(tmp_path / "a"), cache)
    state["model"]["b"] = torch.randn(4).to_sparse()  # same shape, dtype and device: only the layout differs
    full_plans = _planned_in_full(monkeypatch)
    with pytest.raises(CheckpointException, match=r"[Ss]parse"):  # torch cannot write one, planned in full either
        _save(state, str(tmp_path / "b"), cache)
    assert full_plans[0] == 1, "a sparse tensor was taken for the dense one of the previous save (prepared)"


def test_a_subclassed_planner_is_never_prepared(tmp_path):
    cache = _SDS.CheckpointMetadataCache()
    _CountingPlanner.local_plans = 0
    for k in range(3):
        _save(_state(k), str(tmp_path / f"s{k}"), cache, planner=_CountingPlanner())
    assert _CountingPlanner.local_plans == 3, "a planner subclass (which may resolve data its own way) was skipped"


def test_an_existing_checkpoint_is_refused_on_a_repeated_save(tmp_path):
    cache = _SDS.CheckpointMetadataCache()
    _save(_state(1), str(tmp_path / "a"), cache)
    before = _files(str(tmp_path / "a"))
    with pytest.raises(CheckpointException, match="already holds a checkpoint"):
        _save(_state(2), str(tmp_path / "a"), cache)
    assert _files(str(tmp_path / "a")) == before, "a repeated save into an existing checkpoint changed its files"


def test_a_value_that_cannot_be_pickled_fails_as_when_planned_in_full(tmp_path):
    cache = _SDS.CheckpointMetadataCache()
    state = _state(1)
    _save(state, str(tmp_path / "a"), cache)
    state["step"] = lambda: None  # same key, a value of another type
    with pytest.raises(CheckpointException, match="cannot be saved"):
        _save(state, str(tmp_path / "b"), cache)
    assert not os.path.exists(tmp_path / "b"), "a refused save created its directory"


def test_the_request_pickler_pickles_a_repeated_item_once(monkeypatch):
    """The worker's requests (callers.RequestPickler): the same plan item in the next request is not pickled
    again, nor unpickled again by the worker; another object is pickled anew, even if equal; what arrives equals
    what was sent."""
    from torch.distributed.checkpoint.planner import WriteItem

    from ckptspec.impl.async_ckpt import callers

    state = _state(1)
    planner = DefaultSavePlanner()
    planner.set_up_planner(state, is_coordinator=True)
    items = planner.create_local_plan().items
    copies = [pickle.loads(pickle.dumps(i)) for i in items]  # equal items, other objects
    pickled: list[WriteItem] = []
    real = pickle.dumps

    def counting(obj: Any, *args: Any) -> bytes:
        if isinstance(obj, WriteItem):
            pickled.append(obj)
        return real(obj, *args)

    monkeypatch.setattr(pickle, "dumps", counting)  # the module callers pickles with
    request = _MODULES.core.AsyncRequest(print, (0, [(i, None) for i in items]), [])
    requests = callers.RequestPickler()
    first = requests.dumps(request)
    assert len(pickled) == len(items)
    again = requests.dumps(request)
    assert len(pickled) == len(items), "items already sent were pickled again"
    requests.dumps(_MODULES.core.AsyncRequest(print, (0, [(i, None) for i in copies]), []))
    assert len(pickled) == 2 * len(items), "equal but other objects must be pickled anew"
    monkeypatch.undo()
    unpickled: list[bytes] = []
    real_loads = pickle.loads

    def counting_loads(data: bytes, *args: Any, **kwargs: Any) -> Any:
        unpickled.append(data)
        return real_loads(data, *args, **kwargs)

    arrived_first = real_loads(first)  # the worker's side, in order
    monkeypatch.setattr(pickle, "loads", counting_loads)  # the module callers unpickles items with
    arrived = real_loads(again)
    assert [i for i, _ in arrived.async_fn_args[1]] == items
    assert not unpickled, f"the worker unpickled again {len(unpickled)} items it had from the previous request"
    assert all(a is b for (a, _), (b, _) in zip(arrived.async_fn_args[1], arrived_first.async_fn_args[1], strict=True))
