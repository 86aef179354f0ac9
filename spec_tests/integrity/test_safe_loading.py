"""IN-4: a pickle planted in local checkpoint storage never runs; the checkpoint it replaced is refused or
recovered from a replica."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist

from spec_tests.harness.asserts import assert_each_rank
from spec_tests.harness.ranks import world
from spec_tests.integrity.damage import files_under
from spec_tests.local.common import Found, assert_found, find_then_load, manager, node_root, rank_value, save, tasd

pytestmark = pytest.mark.needs("local_checkpointing")
LAYOUTS = [pytest.param(None, id="no-replication"), pytest.param((1, 2), id="jump1-factor2")]


class Planted:
    """Unpickling this creates the directory `marker`: the observable stand-in for arbitrary code."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _plant_then_load(base, layout):
    rank, _ = world()
    marker = os.path.join(base, f"code-ran-on-rank{rank}")
    save(manager(base, layout), tasd(rank_value(rank, 1)), 1)
    dist.barrier()
    if rank == 0:
        for path in files_under(node_root(base, 0)):
            torch.save({"state": Planted(os.path.join(base, "code-ran"))}, path)
    dist.barrier()
    found = find_then_load(manager(base, layout))
    ran = os.path.exists(os.path.join(base, "code-ran")) or os.path.exists(marker)
    return ran, found


@pytest.mark.spec("IN-4")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_planted_pickle_never_runs(rank_pool, tmp_path, layout):
    results = rank_pool(2).run(_plant_then_load, str(tmp_path), layout)
    assert_each_rank("code ran", [r[0] for r in results], False, call="loading after rank 0's parts were replaced")
    found: list[Found] = [r[1] for r in results]
    if layout is not None:
        assert_found(found, 1, [rank_value(r, 1) for r in range(2)], f"rank 0's parts planted, replicated {layout}")
        return
    assert all(f.load == "CheckpointingException" for f in found), (
        f"rank 0's part replaced by a planted pickle: per rank {[(f.latest, f.load) for f in found]}, but the "
        "checkpoint should be refused on every rank (find_latest() -1 or load() CheckpointingException)"
    )
