"""IN-3: a local checkpoint part damaged after commit is never returned as data; an intact replica replaces it.
IN-3w: a part truncated or deleted (damage seen without a checksum) is never returned as data.

Each example saves iteration 1 on two ranks (and iteration 2 under another root, the source of another
iteration's parts), damages one file of one rank's node-local storage as hypothesis chooses (a swap copies in
another rank's or another iteration's file), then loads with fresh managers.
"""

from __future__ import annotations

import os
import uuid

import pytest
from hypothesis import assume, example, given
from hypothesis import strategies as st

from ckptspec.spec.drivers.damage import Damage, damages, load_damaged_local
from ckptspec.spec.drivers.local import Found, assert_found, rank_value
from ckptspec.spec.harness.asserts import assert_state_dict_equal

pytestmark = pytest.mark.needs("local_checkpointing")
LAYOUTS = [pytest.param(None, id="no-replication"), pytest.param((1, 2), id="jump1-factor2")]


@pytest.mark.spec("IN-3", "IN-1")
@pytest.mark.parametrize("layout", LAYOUTS)
@given(damage=damages(), holder=st.integers(0, 1), from_rank=st.booleans())
@example(damage=Damage("swap", file=0, where=0.0, bit=0), holder=0, from_rank=False)  # the same rank's iteration 2
def test_a_damaged_part_is_never_loaded(rank_pool, tmp_path_factory, layout, damage, holder, from_rank):
    base = os.path.join(str(tmp_path_factory.mktemp("lmd")), uuid.uuid4().hex)
    results = rank_pool(2).run(load_damaged_local, base, layout, damage, holder, from_rank)
    damaged = results[0][0]
    assume(damaged is not None)
    found: list[Found] = [r[1] for r in results]
    what = f"{damage.describe(damaged)} on rank {holder}'s storage after save(1)"
    if layout is not None:  # the other rank holds an intact copy of every part
        assert_found(found, 1, [rank_value(r, 1) for r in range(2)], f"{what}, replicated {layout}")
        return
    refused = all(f.latest == -1 and f.load == "CheckpointingException" for f in found) or all(
        f.latest == 1 and f.load == "CheckpointingException" for f in found
    )
    assert refused, (
        f"{what}, no replication: per rank {[(f.latest, f.load) for f in found]}, but find_latest() should not "
        "report iteration 1, or load() should raise CheckpointingException on every rank (never return data)"
    )


SHAPE_DAMAGES = [  # damage that changes a part's length: no checksum is needed to see it
    Damage("truncate", file=0, where=0.0, bit=0),
    Damage("truncate", file=0, where=0.5, bit=0),
    Damage("delete", file=0, where=0.0, bit=0),
]


def _returned_as_data(found: Found, rank: int) -> str | None:
    """Why what `rank` found and loaded is damaged data, or None (nothing reported, load() raised, or exact)."""
    if found.latest == -1 or found.load != "returned":
        return None
    if found.latest != 1 or found.part_id != (1, rank, ""):
        return f"found {found.latest} and loaded part {found.part_id}"
    try:
        assert_state_dict_equal(found.state_dict, rank_value(rank, 1), call=f"rank {rank}: load()")
    except AssertionError as exc:
        return str(exc)
    return None


@pytest.mark.spec("IN-3w")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_truncated_or_deleted_part_is_never_returned_as_data(rank_pool, tmp_path, layout):
    """Each damage that changes a part's length, on rank 0's first file: every rank reports no iteration, raises
    from load(), or loads exactly what it saved."""
    problems = []
    for n, damage in enumerate(SHAPE_DAMAGES):
        results = rank_pool(2).run(load_damaged_local, str(tmp_path / str(n)), layout, damage, 0, False)
        damaged = results[0][0]
        assert damaged is not None, f"{damage.kind} at {damage.where} changed no file of rank 0's storage"
        for rank, (_, found) in enumerate(results):
            why = _returned_as_data(found, rank)
            if why:
                problems.append(f"{damage.describe(damaged)} on rank 0's storage, rank {rank}: {why}")
    where = f"replicated {layout}" if layout else "no replication"
    assert not problems, f"{where}, a damaged part was returned as data: " + "; ".join(problems)
