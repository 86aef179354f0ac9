"""IN-1, IN-2: a FileSystemWriterAsync checkpoint damaged after commit is detected by CachedMetadataFileSystemReader.

Each example saves the state twice (the second time with every element changed, the source of swapped-in
files), damages one file of the first checkpoint as hypothesis chooses, and loads it on every rank.
"""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import assume, given

from spec_tests.harness import strategies
from spec_tests.integrity.damage import damages, load_damaged_checkpoint

pytestmark = pytest.mark.needs("storage_writer", "temporal_caller")


@pytest.mark.spec("IN-1", "IN-2")
@pytest.mark.parametrize("world_size", [1, 2])
@given(state_dict=strategies.dcp_state_dicts(max_leaves=4), damage=damages())
def test_damage_after_commit_is_detected_at_load(rank_pool, tmp_path_factory, world_size, state_dict, damage):
    base = os.path.join(str(tmp_path_factory.mktemp("dmg")), uuid.uuid4().hex)
    results = rank_pool(world_size).run(load_damaged_checkpoint, base, state_dict, damage)
    assume(results[0] is not None)
    assert results == ["detected"] * world_size, (
        f"{damage} of a committed checkpoint, loaded with CachedMetadataFileSystemReader on {world_size} rank(s): "
        f"per rank {results}, but every rank should raise an error naming the damaged file"
    )
