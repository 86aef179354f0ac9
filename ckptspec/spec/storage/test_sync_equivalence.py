"""Async equals sync (FS-18): what the async path writes is what torch's synchronous FileSystemWriter writes.

Each example saves one state dict twice on the same ranks, with the same DefaultSavePlanner and thread_count:
through the target's async path, and through torch's `state_dict_saver.save` with `FileSystemWriter`. The
reference is torch itself, so the property needs no model of the file format.
"""

from __future__ import annotations

import os
import uuid

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.checkpoint import FileSystemWriter, state_dict_saver
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from ckptspec.spec.drivers import saving
from ckptspec.spec.harness import strategies
from ckptspec.spec.harness.processes import CALLERS, remove
from ckptspec.spec.harness.ranks import world

pytestmark = pytest.mark.needs("storage_writer")
SAME_FIELDS = ("state_dict_metadata", "planner_data", "version")


@st.composite
def _options(draw):
    thread_count = draw(st.integers(1, 4), label="thread_count")
    hint = draw(st.sampled_from([None, None, "a", "sh"]) if thread_count >= 2 else st.none(), label="separation_hint")
    return {"thread_count": thread_count, "separation_hint": hint}


def _rank_state(state_dict, rank: int) -> dict:
    """The shared part (the same on every rank, so DCP deduplicates it) and this rank's own part, with something
    to write on every rank (nothing to write is FS-16's case)."""
    own = {"anchor": torch.arange(rank + 3), **strategies.private_copy(state_dict)}
    return {"shared": state_dict, f"rank{rank}": own}


def _read(directory: str, info) -> bytes:
    with open(os.path.join(directory, info.relative_path), "rb") as f:
        f.seek(info.offset)
        return f.read(info.length)


def _non_empty_files(directory: str) -> dict[str, bytes]:
    out = {}
    for name in saving.data_files(directory):
        with open(os.path.join(directory, name), "rb") as f:
            data = f.read()
        if data:
            out[name] = data
    return out


def differences(async_dir: str, sync_dir: str, hinted: bool) -> list[str]:
    """How the async checkpoint differs from the synchronous one where FS-18 requires them equal."""
    mine, torch_md = saving.read_metadata(async_dir), saving.read_metadata(sync_dir)
    found = [f"metadata.{name} differs" for name in SAME_FIELDS if getattr(mine, name) != getattr(torch_md, name)]
    if set(mine.storage_data) != set(torch_md.storage_data):
        found.append(
            f"storage_data records items {sorted(i.fqn for i in mine.storage_data)}, "
            f"torch's {sorted(i.fqn for i in torch_md.storage_data)}"
        )
        return found
    for index, info in torch_md.storage_data.items():
        if _read(async_dir, mine.storage_data[index]) != _read(sync_dir, info):
            found.append(f"the bytes of item {index.fqn!r} differ from torch's")
    if hinted:
        return found
    if mine.storage_data != torch_md.storage_data:
        found.append("metadata.storage_data differs (file, offset or length of an item)")
    ours, theirs = _non_empty_files(async_dir), _non_empty_files(sync_dir)
    if sorted(ours) != sorted(theirs):
        found.append(f"non-empty data files {sorted(ours)}, torch's {sorted(theirs)}")
    found += [f"{name} is not byte-identical to torch's" for name in sorted(ours) if ours[name] != theirs.get(name)]
    return found


def _save_both_ways(base: str, state_dict, options: dict, persistent: bool, use_msc: bool) -> list[str] | None:
    rank, _ = world()
    state = _rank_state(state_dict, rank)
    async_dir, sync_dir = os.path.join(base, "async"), os.path.join(base, "sync")
    where = "msc://__filesystem__" + async_dir if use_msc else async_dir
    writer_kwargs: dict = {**options, **({"use_msc": True} if use_msc else {})}
    saving.async_save(state, where, persistent=persistent, **writer_kwargs)
    state_dict_saver.save(
        state,
        storage_writer=FileSystemWriter(sync_dir, thread_count=options["thread_count"]),
        planner=DefaultSavePlanner(),
    )
    if rank != 0:
        return None  # both saves are collective: every rank's files are written by now
    found = differences(async_dir, sync_dir, options["separation_hint"] is not None)
    remove(base)
    return found


def _check(rank_pool, world_size, tmp, state_dict, options, persistent=False, use_msc=False):
    base = os.path.join(tmp, uuid.uuid4().hex)
    found = rank_pool(world_size).run(_save_both_ways, base, state_dict, options, persistent, use_msc)[0]
    assert not found, (
        f"an async save with {options} on {world_size} rank(s){' through MSC' if use_msc else ''} "
        f"differs from torch's synchronous FileSystemWriter save: {'; '.join(found)}"
    )


@pytest.mark.spec("FS-18")
@pytest.mark.parametrize("persistent", CALLERS)
@given(state_dict=strategies.dcp_state_dicts(max_leaves=6), options=_options())
def test_one_rank_async_save_writes_what_the_sync_save_writes(
    rank_pool, tmp_path_factory, persistent, state_dict, options
):
    _check(rank_pool, 1, str(tmp_path_factory.mktemp("eq")), state_dict, options, persistent=persistent)


@pytest.mark.spec("FS-18")
@pytest.mark.needs("temporal_caller")
@pytest.mark.parametrize("world_size", [2, 4])
@given(state_dict=strategies.dcp_state_dicts(max_leaves=5), options=_options())
def test_multi_rank_async_save_writes_what_the_sync_save_writes(
    rank_pool, tmp_path_factory, world_size, state_dict, options
):
    _check(rank_pool, world_size, str(tmp_path_factory.mktemp("eq")), state_dict, options)


@pytest.mark.spec("FS-18")
@pytest.mark.needs("temporal_caller", "msc")
@pytest.mark.parametrize("world_size", [1, 2])
@given(state_dict=strategies.dcp_state_dicts(max_leaves=5), options=_options())
def test_msc_async_save_writes_what_the_sync_save_writes(rank_pool, tmp_path_factory, world_size, state_dict, options):
    _check(rank_pool, world_size, str(tmp_path_factory.mktemp("eq")), state_dict, options, use_msc=True)
