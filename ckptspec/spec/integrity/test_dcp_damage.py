"""IN-1, IN-2: a FileSystemWriterAsync checkpoint damaged after commit is detected by CachedMetadataFileSystemReader.

Each example saves the state twice (the second time with every element changed, the source of swapped-in
files), damages one file of the first checkpoint as hypothesis chooses, and loads it on every rank.
"""

from __future__ import annotations

import os
import uuid

import pytest
import torch
from hypothesis import assume, example, given

from ckptspec.spec.drivers import saving
from ckptspec.spec.drivers.damage import Damage, damages, files_under, load_damaged_checkpoint
from ckptspec.spec.harness import strategies
from ckptspec.spec.harness.asserts import attempt
from ckptspec.spec.harness.ranks import run_on_ranks

pytestmark = pytest.mark.needs("storage_writer", "temporal_caller")


@pytest.mark.spec("IN-1", "IN-2")
@pytest.mark.parametrize("world_size", [1, 2])
@given(state_dict=strategies.dcp_state_dicts(max_leaves=4), damage=damages())
# Issue 45: a bit flipped in the third file, whose only item is an empty tensor (a load reads no byte of it).
@example(state_dict={"a": {}, "aa": torch.tensor([])}, damage=Damage("flip", file=2, where=0.5, bit=0))
def test_damage_after_commit_is_detected_at_load(rank_pool, tmp_path_factory, world_size, state_dict, damage):
    base = os.path.join(str(tmp_path_factory.mktemp("dmg")), uuid.uuid4().hex)
    results = rank_pool(world_size).run(load_damaged_checkpoint, base, state_dict, damage)
    assume(results[0] is not None)
    assert results == ["detected"] * world_size, (
        f"{damage} of a committed checkpoint, loaded with CachedMetadataFileSystemReader on {world_size} rank(s): "
        f"per rank {results}, but every rank should raise an error naming the damaged file"
    )


def _load_each_item_of_a_truncated_checkpoint(base: str) -> dict[str, str]:
    """Save two tensors into one data file, cut its last byte, load each tensor alone: what each load did."""
    state = {"first": torch.arange(64.0), "second": torch.arange(64.0) + 100}
    saving.async_save(state, base, thread_count=1)
    (data,) = [f for f in files_under(base) if os.path.basename(f) != ".metadata"]
    os.truncate(data, os.path.getsize(data) - 1)
    outcomes = {}
    for key in state:
        reader = saving.module("cached_metadata_filesystem_reader").CachedMetadataFileSystemReader(base)
        part = {key: state[key]}
        loaded = attempt(saving.load, part, base, reader, bound=saving.FINALIZE_BOUND, what="dcp.load", hung_fails=True)
        if loaded.returned:
            outcomes[key] = "loaded without an error"
        else:
            named = os.path.basename(data) in loaded.message
            outcomes[key] = "detected" if named else f"raised without naming the file: {loaded.message[:200]}"
    return outcomes


@pytest.mark.spec("IN-2")
def test_a_truncated_data_file_is_detected_by_a_load_of_any_item_in_it(tmp_path):
    """The truncation cuts only the file's last item: a load of the other one must still see the damage (the
    file's size is in .metadata, IN-1), not only a load of the item that was cut."""
    outcomes = run_on_ranks(_load_each_item_of_a_truncated_checkpoint, 1, (str(tmp_path / "c"),), timeout=180)[0]
    assert outcomes == {"first": "detected", "second": "detected"}, (
        f"a data file truncated by one byte, each of its two tensors loaded alone with "
        f"CachedMetadataFileSystemReader: {outcomes}; every load should raise naming the file"
    )
