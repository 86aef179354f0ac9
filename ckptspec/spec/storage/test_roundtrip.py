"""What the async path saves is what stock DCP loads: values, views, the snapshot point (at its weak level FS-4w, each
element as scheduled or as updated), empty state dicts."""

import os
import uuid

import pytest
import torch
import torch.distributed.checkpoint as dcp
from hypothesis import given
from hypothesis import strategies as st

from ckptspec.spec.drivers import saving
from ckptspec.spec.harness import strategies, workloads
from ckptspec.spec.harness.asserts import assert_equal, assert_state_dict_equal
from ckptspec.spec.harness.processes import CALLERS, remove
from ckptspec.spec.harness.ranks import devices

pytestmark = pytest.mark.needs("storage_writer")
EMPTY_BOUND = 20.0  # nothing to write on a warm queue: finalization is immediate


def _fresh_dir(tmp):
    return os.path.join(tmp, uuid.uuid4().hex)


@st.composite
def _writer_options(draw):
    thread_count = draw(st.integers(1, 4), label="thread_count")
    hint = draw(st.sampled_from([None, "a", "b", "sh"]) if thread_count >= 2 else st.none(), label="separation_hint")
    return {"thread_count": thread_count, "separation_hint": hint}


def _save_and_load(tmp, state_dict, options):
    path = _fresh_dir(tmp)
    state_dict = {"anchor": torch.arange(3), **state_dict}  # something to write: nothing to write is FS-16's case
    saving.async_save(state_dict, path, persistent=True, **options)
    problem = saving.mismatch(
        saving.load(state_dict, path), state_dict, f"dcp.load(FileSystemReader) of an async save with {options}"
    )
    remove(path)
    return problem


@pytest.mark.spec("FS-1", "FS-2", "SD-1")
@pytest.mark.needs("persistent_caller")
@given(state_dict=strategies.dcp_state_dicts(), options=_writer_options())
def test_async_save_loads_back_exactly_with_stock_dcp(rank_pool, tmp_path_factory, state_dict, options):
    problem = rank_pool(1).run(_save_and_load, str(tmp_path_factory.mktemp("rt")), state_dict, options)[0]
    assert problem is None, problem


def _views_only(tmp):
    path = _fresh_dir(tmp)
    base = torch.arange(1 << 16, dtype=torch.float32)  # 256 KiB
    state_dict = {"slice": base[5:9], "strided": base[::8192], "column": base.view(256, 256)[:, 3]}
    saving.async_save(state_dict, path)
    assert_state_dict_equal(saving.load(state_dict, path), state_dict, call="dcp.load of saved views")
    return sum(os.path.getsize(os.path.join(path, f)) for f in saving.data_files(path))


@pytest.mark.spec("FS-3")
@pytest.mark.needs("temporal_caller")
def test_only_the_elements_of_a_view_are_saved(rank_pool, tmp_path):
    size = rank_pool(1).run(_views_only, str(tmp_path))[0]
    assert size < 32 * 1024, (
        f"data files of 3 small views of a 256 KiB tensor take {size} bytes, "
        "but should take about the views' bytes (the whole base tensor was saved)"
    )


def _save_updated_while_waiting(tmp, state_dict, persistent) -> str:
    """Schedule a save of `state_dict` whose write waits at a gate, update its tensors in place, let the write go
    and finalize: the checkpoint's path."""
    path, gate = _fresh_dir(tmp), os.path.join(tmp, uuid.uuid4().hex)
    writer = saving.module("filesystem_async").FileSystemWriterAsync(path, thread_count=2)
    queue = saving.queue(persistent)
    queue.schedule_async_request(saving.request(writer, saving.plan(state_dict, writer), gate=gate))
    strategies.mutate_in_place(state_dict)
    workloads.open_gate(gate)
    saving.finalize(queue)
    return path


def _snapshot(tmp, state_dict, persistent):
    device = devices.current()
    state_dict = {"anchor": torch.arange(6.0, device=device), **strategies.private_copy(state_dict, device)}
    expected = strategies.private_copy(state_dict, "cpu")  # dcp.load reads into CPU tensors
    path = _save_updated_while_waiting(tmp, state_dict, persistent)
    return saving.mismatch(
        saving.load(expected, path), expected, "dcp.load of a save whose tensors were updated in place after scheduling"
    )


@pytest.mark.spec("FS-4")
@pytest.mark.tensor_device
@pytest.mark.parametrize("persistent", CALLERS)
@given(state_dict=strategies.dcp_state_dicts(max_leaves=4))
def test_the_checkpoint_holds_the_state_when_scheduling_returned(rank_pool, tmp_path_factory, persistent, state_dict):
    problem = rank_pool(1).run(_snapshot, str(tmp_path_factory.mktemp("snap")), state_dict, persistent)[0]
    assert problem is None, problem


def _snapshot_weak(tmp, persistent) -> list[str]:
    state_dict = strategies.private_copy(strategies.WEAK_STATE, devices.current())
    path = _save_updated_while_waiting(tmp, state_dict, persistent)
    return strategies.neither_old_nor_mutated(saving.load(strategies.WEAK_STATE, path), strategies.WEAK_STATE)


@pytest.mark.spec("FS-4w")
@pytest.mark.tensor_device
@pytest.mark.parametrize("persistent", CALLERS)
def test_each_element_is_saved_as_scheduled_or_as_updated(rank_pool, tmp_path, persistent):
    problems = rank_pool(1).run(_snapshot_weak, str(tmp_path), persistent)[0]
    assert not problems, "dcp.load of a save whose tensors were updated after scheduling: " + "; ".join(problems)


def _empty(tmp, persistent):
    saving.async_save({"w": torch.ones(2)}, _fresh_dir(tmp), persistent=persistent)  # the queue has saved before
    path = _fresh_dir(tmp)
    saving.async_save({}, path, persistent=persistent, thread_count=3, bound=EMPTY_BOUND)
    assert_equal("files", sorted(os.listdir(path)), [".metadata"], call="an async save of an empty state dict")
    loaded: dict = {}
    dcp.load(loaded, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    assert_equal("loaded", loaded, {}, call="dcp.load of an empty checkpoint")


@pytest.mark.spec("FS-16")
@pytest.mark.parametrize("persistent", CALLERS)
def test_an_empty_state_dict_gives_a_loadable_checkpoint(rank_pool, tmp_path, persistent):
    rank_pool(1).run(_empty, str(tmp_path), persistent)


def _stock_save_target_reader(tmp, state_dict):
    path = _fresh_dir(tmp)
    dcp.save(state_dict, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    reader_cls = saving.module("cached_metadata_filesystem_reader").CachedMetadataFileSystemReader
    problem = saving.mismatch(
        saving.load(state_dict, path, reader=reader_cls(path)),
        state_dict,
        "dcp.load(CachedMetadataFileSystemReader) of a stock dcp.save",
    )
    async_path = _fresh_dir(tmp)
    saving.async_save(state_dict, async_path, thread_count=2, persistent=None)
    problem = problem or saving.mismatch(
        saving.load(state_dict, async_path, reader=reader_cls(async_path)),
        state_dict,
        "dcp.load(CachedMetadataFileSystemReader) of an async save",
    )
    remove(path, async_path)
    return problem


@pytest.mark.spec("SD-10")
@given(state_dict=strategies.dcp_state_dicts())
def test_the_cached_metadata_reader_loads_stock_and_async_checkpoints(rank_pool, tmp_path_factory, state_dict):
    problem = rank_pool(1).run(_stock_save_target_reader, str(tmp_path_factory.mktemp("cmr")), state_dict)[0]
    assert problem is None, problem


def _reader_cache(tmp):
    path = _fresh_dir(tmp)
    cls = saving.module("cached_metadata_filesystem_reader").CachedMetadataFileSystemReader
    dcp.save({"w": torch.zeros(2)}, storage_writer=dcp.FileSystemWriter(path), no_dist=True)
    reader = cls(path)
    first = reader.read_metadata()
    assert reader.read_metadata() is first, "a second read_metadata() on the same reader read the metadata again"
    dcp.save(
        {"w": torch.zeros(2), "v": torch.ones(3)},
        storage_writer=dcp.FileSystemWriter(path, overwrite=True),
        no_dist=True,
    )
    fresh = cls(path).read_metadata()
    assert_equal(
        "keys",
        sorted(fresh.state_dict_metadata),
        ["v", "w"],
        call="a new reader's read_metadata() of the rewritten checkpoint",
    )


@pytest.mark.spec("SD-10")
def test_the_reader_caches_metadata_per_instance(rank_pool, tmp_path):
    rank_pool(1).run(_reader_cache, str(tmp_path))
