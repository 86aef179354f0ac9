"""IN-3: a local checkpoint part damaged after commit is never returned as data; an intact replica replaces it.

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

from spec_tests.drivers.damage import Damage, damages, load_damaged_local
from spec_tests.drivers.local import Found, assert_found, rank_value

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
