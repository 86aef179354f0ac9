"""IN-1, IN-2: a FileSystemWriterAsync checkpoint damaged after commit is detected by CachedMetadataFileSystemReader.

Each example saves the state twice (the second time with every element changed, the source of swapped-in
files), damages one file of the first checkpoint as hypothesis chooses, and loads it on every rank.
"""

from __future__ import annotations

import os
import uuid

import pytest
import torch
import torch.distributed as dist
from hypothesis import assume, given

from spec_tests.harness import strategies
from spec_tests.harness.asserts import attempt
from spec_tests.harness.processes import remove
from spec_tests.harness.ranks import world
from spec_tests.integrity.damage import apply, damages, files_under
from spec_tests.storage import saving

pytestmark = pytest.mark.needs("storage_writer", "temporal_caller")


def _load_damaged(base, state_dict, damage):
    rank, _ = world()
    state = {"anchor": torch.arange(4.0), **strategies.private_copy(state_dict)}
    good, other = os.path.join(base, "good"), os.path.join(base, "other")
    saving.async_save(state, good, thread_count=2)
    changed = strategies.private_copy(state)
    strategies.mutate_in_place(changed)
    saving.async_save(changed, other, thread_count=2)
    damaged = apply(damage, files_under(good), files_under(other)) if rank == 0 else None
    holder = [damaged]
    dist.broadcast_object_list(holder, src=0)
    damaged = holder[0]
    if damaged is None:
        return None
    reader = saving.module("cached_metadata_filesystem_reader").CachedMetadataFileSystemReader(good)
    outcome = attempt(saving.load, state, good, reader, bound=saving.FINALIZE_BOUND, what="dcp.load", hung_fails=True)
    dist.barrier()
    if rank == 0:
        remove(base)
    name = os.path.basename(damaged)
    if outcome.returned:
        problem = saving.mismatch(outcome.value, state, "dcp.load")
        return f"dcp.load returned {'damaged data' if problem else 'the data'} without an error"
    if name not in outcome.message:
        return f"dcp.load raised {outcome.text}, but its message does not name {name}: {outcome.message[:300]}"
    return "detected"


@pytest.mark.spec("IN-1", "IN-2")
@pytest.mark.parametrize("world_size", [1, 2])
@given(state_dict=strategies.dcp_state_dicts(max_leaves=4), damage=damages())
def test_damage_after_commit_is_detected_at_load(rank_pool, tmp_path_factory, world_size, state_dict, damage):
    base = os.path.join(str(tmp_path_factory.mktemp("dmg")), uuid.uuid4().hex)
    results = rank_pool(world_size).run(_load_damaged, base, state_dict, damage)
    assume(results[0] is not None)
    assert results == ["detected"] * world_size, (
        f"{damage} of a committed checkpoint, loaded with CachedMetadataFileSystemReader on {world_size} rank(s): "
        f"per rank {results}, but every rank should raise an error naming the damaged file"
    )
