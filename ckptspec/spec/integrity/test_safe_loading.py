"""IN-4: a pickle planted in local checkpoint storage never runs; the checkpoint it replaced is refused or
recovered from a replica."""

from __future__ import annotations

import pytest

from ckptspec.spec.drivers.damage import plant_then_load
from ckptspec.spec.drivers.local import Found, assert_found, rank_value
from ckptspec.spec.harness.asserts import assert_each_rank

pytestmark = pytest.mark.needs("local_checkpointing")
LAYOUTS = [pytest.param(None, id="no-replication"), pytest.param((1, 2), id="jump1-factor2")]


@pytest.mark.spec("IN-4")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_planted_pickle_never_runs(rank_pool, tmp_path, layout):
    results = rank_pool(2).run(plant_then_load, str(tmp_path), layout)
    assert_each_rank("code ran", [r[0] for r in results], False, call="loading after rank 0's parts were replaced")
    found: list[Found] = [r[1] for r in results]
    if layout is not None:
        assert_found(found, 1, [rank_value(r, 1) for r in range(2)], f"rank 0's parts planted, replicated {layout}")
        return
    assert all(f.load == "CheckpointingException" for f in found), (
        f"rank 0's part replaced by a planted pickle: per rank {[(f.latest, f.load) for f in found]}, but the "
        "checkpoint should be refused on every rank (find_latest() -1 or load() CheckpointingException)"
    )
