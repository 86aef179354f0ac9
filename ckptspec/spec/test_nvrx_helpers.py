"""API-2: the NVRx helpers a mirroring target adds behave as NVRx's do (the names alone are test_api_surface's).

Only for a target whose adapter declares NVRX_MIRROR (impl): NVRx's own helpers are what these describe.
"""

from __future__ import annotations

import gc
import importlib
import logging

import pytest
import torch

pytestmark = pytest.mark.spec("API-2")


@pytest.fixture
def mirror(target):
    package = getattr(target.adapter, "NVRX_MIRROR", None)
    if package is None:
        pytest.skip(f"target {target.name!r} does not mirror NVRx's modules")
    return lambda module: importlib.import_module(f"{package}.{module}")


def test_diff_reports_paths_on_each_side_and_mismatched_values(mirror):
    diff = mirror("utils").diff
    left = {"a": torch.ones(2), "b": [1, 2, 3], "c": {"x": 1}, "only_left": 0}
    right = {"a": torch.tensor([1.0, 2.0]), "b": [1, 5], "c": {"x": 1, "y": 2}, "only_right": 0}
    only_left, only_right, mismatch = diff(left, right)
    assert sorted(only_left, key=repr) == [("b", 2), ("only_left",)]
    assert sorted(only_right, key=repr) == [("c", "y"), ("only_right",)]
    assert sorted(mismatch, key=repr) == [(("a",), torch.Tensor, torch.Tensor), (("b", 1), int, int)]
    assert diff(left, left) == ([], [], [])


def test_the_dict_list_maps_and_nested_values(mirror):
    utils, basic = mirror("utils"), mirror("local.basic_state_dict")
    x = {"a": [1, {"b": 2}], "c": (3, 4)}
    assert utils.dict_list_map_outplace(lambda v: v * 10, x) == {"a": [10, {"b": 20}], "c": (3, 4) * 10}
    assert x == {"a": [1, {"b": 2}], "c": (3, 4)}, "the out-of-place map changed its input"
    assert list(basic.nested_values(x)) == [1, 2, (3, 4)]
    assert basic.dict_list_map_inplace(lambda v: -v if isinstance(v, int) else v, x) is x
    assert x == {"a": [-1, {"b": -2}], "c": (3, 4)}


def test_preload_tensors_and_wrap_for_async(mirror):
    utils = mirror("utils")
    state: dict = {"t": torch.arange(3), "n": [torch.zeros(1), "s"]}
    loaded = utils.preload_tensors(state, non_blocking=False)
    assert loaded is not state
    assert loaded["n"] is not state["n"]
    assert torch.equal(loaded["t"], state["t"])
    assert loaded["n"][1] == "s"
    seen = []
    wrapped = utils.wrap_for_async(lambda *a, **k: seen.append((gc.isenabled(), a, k)))
    enabled = gc.isenabled()
    assert wrapped(1, key=2) is None
    assert seen == [(False, (1,), {"key": 2})]
    assert gc.isenabled() == enabled


def test_debug_time_logs_under_the_stacked_names(mirror, caplog):
    utils = mirror("utils")
    log = logging.getLogger("ckptspec.debug_time")
    with caplog.at_level(logging.DEBUG, logger=log.name), utils.debug_time("outer", log), utils.debug_time("inner"):
        utils.debug_msg("hello")
    messages = [r.getMessage() for r in caplog.records if r.name == log.name]
    assert messages[0] == "outer.inner hello"
    assert messages[1].startswith("outer.inner took ")
    assert messages[2].startswith("outer took ")


def test_torch_async_checkpoint_save_is_torch_save(mirror):
    ckpt = mirror("async_ckpt.torch_ckpt").TorchAsyncCheckpoint()
    try:
        assert ckpt.save is torch.save
    finally:
        ckpt.close()


def test_execute_finalize_fns_runs_them_in_order_and_returns_the_index(mirror):
    core = mirror("async_ckpt.core")
    ran: list[int] = []
    request = core.AsyncRequest(None, (), [lambda: ran.append(1), lambda: ran.append(2)], call_idx=7)
    assert request.execute_finalize_fns() == 7  # no process group: nothing to validate against
    assert ran == [1, 2]


def test_abort_nvrx_checkpoint_closes_every_open_queue(mirror):
    core = mirror("async_ckpt.core")
    queue = core.AsyncCallsQueue()
    core.abort_nvrx_checkpoint()
    with pytest.raises(RuntimeError):
        queue.schedule_async_request(core.AsyncRequest(None, (), []))


def test_batched_and_the_lazy_strategy(mirror):
    group_utils, strategies = mirror("local.replication.group_utils"), mirror("local.replication.strategies")
    assert list(group_utils.batched("ABCDEFG", 3)) == [("A", "B", "C"), ("D", "E", "F"), ("G",)]
    lazy = strategies.LazyCliqueReplicationStrategy(replication_jump=1, replication_factor=2)  # no process group yet
    assert (lazy.replication_jump, lazy.replication_factor) == (1, 2)
    assert isinstance(lazy, strategies.ReplicationStrategy)
