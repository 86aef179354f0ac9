"""Local checkpointing under node loss and under a rank killed during the replica exchange.

Four ranks on two "nodes" of two ranks each (node n holds ranks 2n and 2n+1); every rank keeps its
local checkpoint under its own root (ckptspec.spec.drivers.local), so losing a node deletes the roots of
its two ranks, and every rank restarts as a fresh process, as after a job restart.
"""

import errno
import functools
import itertools
import os
import signal
from dataclasses import dataclass

import pytest

from ckptspec.spec.drivers.bounds import BOUND
from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.drivers.faults.tmpdirs import on_ranks
from ckptspec.spec.harness import HUNG, assert_each_rank, attempt, outcome_of, world

WORLD = 4
RANKS_PER_NODE = 2
LAYOUTS = (None, (1, 2), (2, 2))  # no replication; cliques inside a node; cliques across nodes
ITERATION = 5


def _node_ranks(node: int) -> list[int]:
    return list(range(node * RANKS_PER_NODE, (node + 1) * RANKS_PER_NODE))


def _recoverable(layout, lost_node: int) -> bool:
    """The clique property: every rank's part still has a holder outside the lost node."""
    from ckptspec.spec.drivers.local import cliques

    groups = [[r] for r in range(WORLD)] if layout is None else cliques(WORLD, *layout)
    lost = set(_node_ranks(lost_node))
    return all(any(m not in lost for m in group) for group in groups)


def _case_dir(tmp, layout, node) -> str:
    name = "none" if layout is None else f"jump{layout[0]}-factor{layout[1]}"
    return os.path.join(tmp, f"{name}-lost{node}")


def _cases():
    return list(itertools.product(LAYOUTS, range(WORLD // RANKS_PER_NODE)))


def _save_every_case(tmp):
    from ckptspec.spec.drivers.local import save_values

    for layout, node in _cases():
        save_values(_case_dir(tmp, layout, node), layout, ITERATION)


@dataclass(frozen=True)
class Restarted:
    found: int  # what find_latest() returned
    load_problem: str | None  # None, or why load() did not give the saved values


def _found_and_loaded(base, layout, iteration) -> Restarted:
    """A restarted rank: what find_latest returned, and None or why load() did not give `iteration`.

    Compared here: tensors do not travel back from a rank that exits right after replying."""
    from ckptspec.spec.drivers.local import fresh_find_then_load, rank_value
    from ckptspec.spec.harness import assert_state_dict_equal

    rank, _ = world()
    found = fresh_find_then_load(base, layout)
    if found.latest != iteration:
        return Restarted(found.latest, None)
    if found.load != "returned":
        return Restarted(found.latest, f"load() raised {found.load}")
    try:
        assert_state_dict_equal(found.state_dict, rank_value(rank, iteration), call="load()")
    except AssertionError as exc:
        return Restarted(found.latest, str(exc))
    return Restarted(found.latest, None)


def _restart_every_case(tmp):
    return {
        (layout, node): _found_and_loaded(_case_dir(tmp, layout, node), layout, ITERATION) for layout, node in _cases()
    }


@pytest.mark.spec("FI-NODE-1")
@pytest.mark.needs("local_checkpointing")
@pytest.mark.parametrize("phase", ["exchange"])
def test_lost_node_recovers_exactly_when_a_copy_survives(tmp_path, phase):
    from ckptspec.spec.drivers.local import lose_nodes

    tmp = str(tmp_path)
    on_ranks(WORLD, _save_every_case, tmp, timeout=120, backend="gloo")
    for layout, node in _cases():
        lose_nodes(_case_dir(tmp, layout, node), _node_ranks(node))
    results = on_ranks(WORLD, _restart_every_case, tmp, timeout=120, backend="gloo")
    problems = []
    for layout, node in _cases():
        want = ITERATION if _recoverable(layout, node) else -1
        for rank, per_case in enumerate(results):
            restarted = per_case[layout, node]
            case = f"replication {layout}, node {node} lost, rank {rank}"
            if restarted.found != want:
                problems.append(f"{case}: find_latest() returned {restarted.found}, but should be {want}")
            elif restarted.load_problem:
                problems.append(f"{case}: {restarted.load_problem}")
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------ rank killed in the exchange

EXCHANGE_LAYOUT = (1, 2)  # world 2: one clique {0, 1}
VICTIM = 1


def _die_then(replicate, *args, **kwargs):
    os.kill(os.getpid(), signal.SIGKILL)
    return replicate(*args, **kwargs)


def _save_then_die_in_exchange(tmp):
    from ckptspec.spec.drivers.local import manager, rank_value, save, tasd

    rank, _ = world()
    save(manager(tmp, EXCHANGE_LAYOUT), tasd(rank_value(rank, 1)), 1)
    mgr = manager(tmp, EXCHANGE_LAYOUT)
    if rank == VICTIM:
        mgr.repl_strategy.replicate = functools.partial(_die_then, mgr.repl_strategy.replicate)
    return outcome_of(
        mgr.save,
        tasd(rank_value(rank, 2)),
        2,
        is_async=False,
        bound=BOUND,
        what=f"a local save whose rank {VICTIM} dies in the replica exchange",
    )


def _restart(tmp):
    return _found_and_loaded(tmp, EXCHANGE_LAYOUT, 1)


@pytest.mark.spec("FI-NODE-2")
@pytest.mark.needs("local_checkpointing")
@pytest.mark.parametrize("phase", ["exchange"])
def test_rank_killed_in_the_replica_exchange(tmp_path, phase):
    tmp = str(tmp_path)
    outcomes = on_ranks(
        2, _save_then_die_in_exchange, tmp, timeout=90, backend="gloo", expect_exit={VICTIM: -signal.SIGKILL}
    )
    assert outcomes[0] not in ("returned", HUNG), (
        f"rank 0's save, whose rank {VICTIM} died in the exchange: {outcomes[0]}, should raise within {BOUND:g}s"
    )
    assert_each_rank(
        "restarted rank",
        on_ranks(2, _restart, tmp, timeout=90, backend="gloo"),
        Restarted(found=1, load_problem=None),
        call=f"find_latest() and load() after rank {VICTIM} died in the exchange of iteration 2's save",
    )


# ------------------------------------------------------------- rank 1's storage fails mid-save

FAILING_RANK = 1
STORAGE_POINTS = {  # where rank 1's storage fails (EIO), as faultfs places it below rank 1's root
    "write-open": {"op": "open"},
    "write-write": {"op": "write"},
    "finalize-rename": {"op": "rename"},
}


@dataclass(frozen=True)
class FailedLocalSave:
    outcome: str  # of save(2): "returned" or the class name of what it raised
    fired: bool  # whether the layer injected the error (rank 1 only)
    then: Restarted  # a new manager on the same rank afterwards


def _save_on_failing_storage(tmp, where, log, hung_fails=True):
    """save(1), then save(2) with rank 1's storage failing at `where`. A rank whose save(2) hung (allowed only
    with hung_fails=False) has a thread left in a collective, so it reports no find/load afterwards."""
    from ckptspec.spec.drivers.local import manager, node_root, rank_value, save, tasd

    rank, _ = world()
    save(manager(tmp), tasd(rank_value(rank, 1)), 1)
    fault = faultfs.Fault("raise", errno=errno.EIO, **where)
    plan = faultfs.Plan(root=node_root(tmp, rank), log=log, faults=(fault,)) if rank == FAILING_RANK else None
    with faultfs.installed(plan):
        outcome = attempt(
            manager(tmp).save,
            tasd(rank_value(rank, 2)),
            2,
            is_async=False,
            bound=BOUND,
            what=f"save(2) while rank {FAILING_RANK}'s storage fails",
            hung_fails=hung_fails,
        )
    fired = plan is not None and bool(faultfs.fired(log, "raise"))
    if not hung_fails:
        return FailedLocalSave(outcome.text, fired, Restarted(-2, "not tried"))
    return FailedLocalSave(outcome.text, fired, _found_and_loaded(tmp, None, 1 if fired else 2))


@pytest.mark.spec("FI-STORAGE-3")
@pytest.mark.needs("local_checkpointing")
@pytest.mark.parametrize("point", list(STORAGE_POINTS))
def test_a_local_save_on_failing_storage_fails_on_every_rank(tmp_path, point):
    log = str(tmp_path / "fs.log")
    results = on_ranks(2, _save_on_failing_storage, str(tmp_path / "ckpt"), STORAGE_POINTS[point], log, timeout=150)
    if not results[FAILING_RANK].fired:  # the target made no such call: the save must simply succeed
        assert_each_rank(
            "save(2)",
            [(r.outcome, r.then) for r in results],
            ("returned", Restarted(2, None)),
            call=f"a local save making no {point.split('-')[1]} below rank {FAILING_RANK}'s root (no fault injected)",
        )
        return
    outcomes = [r.outcome for r in results]
    assert all(o in ("CheckpointException", "CheckpointingException") for o in outcomes), (
        f"save(2) per rank={outcomes}, but should raise CheckpointingException on every rank "
        f"[EIO at the first {point.split('-')[1]} of rank {FAILING_RANK}'s part]"
    )
    assert_each_rank(
        "after the failed save(2)",
        [r.then for r in results],
        Restarted(1, None),
        call="find_latest() and load() by a new manager: the last complete checkpoint",
    )


def _restart_at_the_last_complete(tmp):
    return _found_and_loaded(tmp, None, 1)


@pytest.mark.spec("FI-STORAGE-3w")
@pytest.mark.needs("local_checkpointing")
@pytest.mark.parametrize("point", list(STORAGE_POINTS))
def test_a_local_save_on_failing_storage_never_passes_for_saved(tmp_path, point):
    tmp, log = str(tmp_path / "ckpt"), str(tmp_path / "fs.log")
    results = on_ranks(2, _save_on_failing_storage, tmp, STORAGE_POINTS[point], log, False, timeout=150)
    if not results[FAILING_RANK].fired:
        pytest.skip(
            f"the target made no {point.split('-')[1]} below rank {FAILING_RANK}'s root (the strict test "
            "checks that its save then succeeds)"
        )
    outcomes = [r.outcome for r in results]
    what = f"EIO at the first {point.split('-')[1]} of rank {FAILING_RANK}'s part"
    assert outcomes[FAILING_RANK] not in ("returned", HUNG), (
        f"save(2) on rank {FAILING_RANK}={outcomes[FAILING_RANK]}, but should raise within {BOUND:g}s [{what}]"
    )
    assert "returned" not in outcomes, f"save(2) per rank={outcomes}, but no rank may return as if saved [{what}]"
    assert_each_rank(
        "restarted rank",
        on_ranks(2, _restart_at_the_last_complete, tmp, timeout=90),
        Restarted(1, None),
        call=f"find_latest() and load() on restarted ranks after save(2) failed ({what})",
    )
