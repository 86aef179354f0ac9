"""CliqueReplicationStrategy: the clique layout, the exchange of parts, and missing replicas (gloo ranks)."""

import itertools
from typing import NamedTuple

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ckptspec.spec.drivers.local import BOUND, cliques, module, strategy, tasd
from ckptspec.spec.harness import strategies
from ckptspec.spec.harness.asserts import assert_each_rank, assert_equal, assert_state_dict_equal, attempt, bounded
from ckptspec.spec.harness.ranks import world

pytestmark = pytest.mark.needs("local_checkpointing")


def _clique_strategy(jump, factor):
    return module("replication.strategies").CliqueReplicationStrategy.from_replication_params(jump, factor)


# --------------------------------------------------------------------------------------- layouts


class Received(NamedTuple):
    """What replicate() gave a rank: the ids of the parts, and the parts themselves (or what they hold)."""

    ids: list
    parts: list


def _replicate_in_every_layout(layouts):
    rank, _ = world()
    seen = {}
    for jump, factor in layouts:
        strat = _clique_strategy(jump, factor)
        parts, ids = bounded(
            BOUND,
            "replicate()",
            strat.replicate,
            tasd({"rank": torch.tensor([rank]), "name": f"r{rank}"}),
            ("part", rank),
        )
        data = [(p.state_dict["rank"].item(), p.state_dict["name"]) for p in parts]
        seen[(jump, factor)] = Received([i[1] for i in ids], data)
    return seen


@pytest.mark.spec("CL-1", "CL-3")
@pytest.mark.parametrize("world_size", [2, 4, 6, 8])  # 6: a jump of 3, whose blocks start at odd ranks
def test_cliques_partition_the_ranks_in_every_valid_layout(rank_pool, world_size):
    layouts = strategies.replication_layouts(world_size)
    seen = rank_pool(world_size).run(_replicate_in_every_layout, layouts)
    for jump, factor in layouts:
        where = f"world_size={world_size}, replication_jump={jump}, replication_factor={factor}"
        members = [seen[rank][(jump, factor)].ids for rank in range(world_size)]
        for rank, clique in enumerate(members):
            assert rank in clique, f"rank {rank} got clique {clique} [{where}]"
            assert len(clique) == factor, f"rank {rank} got clique {clique} [{where}]"
            gaps = {b - a for a, b in itertools.pairwise(clique)}
            assert gaps <= {jump}, f"rank {rank}'s clique {clique} is not spaced {jump} apart [{where}]"
            assert all(members[m] == clique for m in clique), f"clique {clique} is not agreed by its members [{where}]"
            assert_equal(
                f"rank {rank}: parts received",
                seen[rank][(jump, factor)].parts,
                [(m, f"r{m}") for m in clique],
                call=f"replicate() in clique {clique}, {where}",
            )
        distinct = sorted({tuple(c) for c in members})
        assert distinct == sorted(map(tuple, cliques(world_size, jump, factor))), (
            f"cliques {distinct}, but the layout defines {cliques(world_size, jump, factor)} [{where}]"
        )


def _construct_invalid(layouts):
    """{(jump, factor): what from_replication_params did, noting an error that does not name both parameters}."""
    outcomes = {}
    for jump, factor in layouts:
        made = attempt(_clique_strategy, jump, factor)
        named = made.returned or (str(jump) in made.message and str(factor) in made.message)
        outcomes[jump, factor] = made.text + ("" if named else " (parameters not named)")
    return outcomes


INVALID_FOR_4 = [(0, 2), (-1, 2), (2, 0), (1, -2), (3, 1), (1, 3), (2, 4), (8, 1), (1, 8), (4, 2)]


@pytest.mark.spec("CL-2")
def test_an_invalid_layout_is_refused_on_every_rank(rank_pool):
    assert_each_rank(
        "from_replication_params(jump, factor)",
        rank_pool(4).run(_construct_invalid, INVALID_FOR_4),
        dict.fromkeys(INVALID_FOR_4, "ValueError"),
        call="on 4 ranks; the error names the parameters",
    )


# -------------------------------------------------------------------------------------- exchange


def _replicate_own_state(states, layout):
    rank, _ = world()
    parts, ids = bounded(BOUND, "replicate()", strategy(layout).replicate, tasd(states[rank]), ("part", rank))
    return Received(list(ids), [p.state_dict for p in parts])


def _assert_replicated(results, states, layout):
    __tracebackhide__ = True
    for clique in cliques(len(states), *layout):
        for rank in clique:
            ids, parts = results[rank]
            assert_equal(
                f"rank {rank}: ids received", ids, [("part", m) for m in clique], call=f"replicate() in clique {clique}"
            )
            for member, part in zip(clique, parts, strict=True):
                assert_state_dict_equal(part, states[member], call=f"replicate() on rank {rank}, part of {member}")


@pytest.mark.spec("CL-3")
@given(data=st.data())
def test_replicate_gives_each_member_every_clique_members_state(rank_pool, data):
    layout = data.draw(strategies.replication_params(4, none=False), label="(jump, factor)")
    states = data.draw(
        st.lists(strategies.state_dicts(max_leaves=4, views=False), min_size=4, max_size=4), label="states"
    )
    _assert_replicated(rank_pool(4).run(_replicate_own_state, states, layout), states, layout)


@pytest.mark.spec("CL-3")
def test_replicate_copies_views_by_value(rank_pool):
    """Strided, transposed and expanded views (a model's tied or transposed weights, a broadcast buffer) arrive
    with their own values."""
    bases = [(torch.arange(12.0) + 100 * rank).reshape(3, 4) for rank in range(2)]
    states = [
        {"strided": base[:, ::2], "transposed": base.t(), "row": base[1], "expanded": base[2, 1:2].expand(5)}
        for base in bases
    ]
    _assert_replicated(rank_pool(2).run(_replicate_own_state, states, (1, 2)), states, (1, 2))


# ---------------------------------------------------------------------------------------- missing


def _plan_with_holders(available, layout):
    rank, _ = world()
    missing = module("replication.strategies").NoReplicasAvailableError
    return attempt(
        strategy(layout).retrieve_plan,
        available,
        [("part", rank)],
        bound=BOUND,
        what="retrieve_plan()",
        hung_fails=True,
        named=(missing,),
    ).text


@pytest.mark.spec("CL-4")
def test_a_part_without_holder_in_the_clique_is_refused_on_every_member(rank_pool):
    # Cliques {0, 1} and {2, 3}: rank 0 holds both parts of its clique; rank 3's part is held only
    # outside its clique (by rank 1), which does not count.
    available = [[("part", 0), ("part", 1)], [("part", 3)], [("part", 2)], []]
    assert_each_rank(
        "retrieve_plan()",
        rank_pool(4).run(_plan_with_holders, available, (1, 2)),
        ["returned", "returned", "NoReplicasAvailableError", "NoReplicasAvailableError"],
        per_rank=True,
        call=f"cliques [0, 1] and [2, 3], parts available per rank {available}",
    )
