"""LocalCheckpointManager refusals and failures on gloo ranks: a failed save, a stale iteration, other
replication parameters at load, an unwritable directory. Each refusal is an error on every rank that keeps
the last good checkpoint (helpers and layouts as in test_local_manager.py)."""

import os
from dataclasses import dataclass

import pytest
from torch.distributed.checkpoint import CheckpointException

from ckptspec.spec.drivers.local import (
    BOUND,
    Found,
    assert_found,
    find_then_load,
    fresh_find_then_load,
    manager,
    module,
    node_root,
    rank_value,
    save,
    save_values,
    tasd,
)
from ckptspec.spec.harness import workloads
from ckptspec.spec.harness.asserts import HUNG, assert_each_rank, attempt, bounded
from ckptspec.spec.harness.processes import async_core
from ckptspec.spec.harness.ranks import run_on_ranks, world

pytestmark = pytest.mark.needs("local_checkpointing")

LAYOUTS_2 = [pytest.param(None, id="no-replication"), pytest.param((1, 2), id="jump1-factor2")]


# --------------------------------------------------------------------------------------- failures


@dataclass(frozen=True)
class FailedSave:
    save: str  # "returned", or the class name of what save() or the blocking finalize raised
    then: Found


def _failing_async_save(base, layout):
    rank, _ = world()
    save(manager(base, layout), tasd(rank_value(rank, 1)), 1)
    values = rank_value(rank, 2)
    if rank == 1:
        values["poison"] = workloads.PickleFails("rank 1 cannot write its part")
    calls = async_core().AsyncCallsQueue(persistent=False)
    mgr = manager(base, layout)

    def save_and_finalize():
        calls.schedule_async_request(bounded(BOUND, "save(is_async=True)", mgr.save, tasd(values), 2, is_async=True))
        bounded(BOUND, "maybe_finalize_async_calls(blocking=True)", calls.maybe_finalize_async_calls, True)

    errors = (CheckpointException, module("ckpt_managers.base_manager").CheckpointingException)
    outcome = attempt(save_and_finalize, named=errors, hung_fails=True)
    calls.close()
    return FailedSave(outcome.text, find_then_load(manager(base, layout)))


@pytest.mark.spec("LM-9")
@pytest.mark.needs("temporal_caller")
@pytest.mark.parametrize("layout", LAYOUTS_2)
def test_a_failed_save_raises_everywhere_and_keeps_the_last_checkpoint(rank_pool, tmp_path, layout):
    results = rank_pool(2).run(_failing_async_save, str(tmp_path), layout)
    outcomes = [r.save for r in results]
    assert all(o in ("CheckpointException", "CheckpointingException") for o in outcomes), (
        f"save per rank={outcomes}, but should be CheckpointException or CheckpointingException on every rank "
        "[an async save whose write fails on rank 1]"
    )
    assert_found([r.then for r in results], 1, [rank_value(r, 1) for r in range(2)], "failed save(2)")


def _listing(base):
    rank, _ = world()
    root = node_root(base, rank)
    return sorted(
        (os.path.relpath(os.path.join(d, f), root), os.path.getsize(os.path.join(d, f)))
        for d, _, files in os.walk(root)
        for f in files
    )


@dataclass(frozen=True)
class RefusedSaves:
    saves: list  # (iteration, "returned" or the class name of what save(iteration) raised)
    storage_unchanged: bool
    then: Found


def _save_old_iterations(base):
    rank, _ = world()
    mgr = manager(base)
    save(mgr, tasd(rank_value(rank, 5)), 5)
    before = _listing(base)
    outcomes = [
        (
            iteration,
            attempt(
                target_mgr.save,
                tasd(rank_value(rank, 0)),
                iteration,
                bound=BOUND,
                what=f"save({iteration})",
                hung_fails=True,
            ).text,
        )
        for target_mgr, iteration in ((mgr, 5), (mgr, 3), (mgr, -1), (manager(base), 4))
    ]
    return RefusedSaves(outcomes, before == _listing(base), find_then_load(manager(base)))


@pytest.mark.spec("LM-10")
def test_an_iteration_not_newer_than_the_latest_is_refused(rank_pool, tmp_path):
    results = rank_pool(2).run(_save_old_iterations, str(tmp_path))
    assert_each_rank(
        "manager",
        results,
        [
            RefusedSaves(
                [(i, "CheckpointingException") for i in (5, 3, -1, 4)], True, Found(5, "returned", (5, rank, ""))
            )
            for rank in range(2)
        ],
        per_rank=True,
        call="after save(5): save(5), save(3), save(-1), a new manager's save(4)",
    )
    assert_found([r.then for r in results], 5, [rank_value(r, 5) for r in range(2)], "refused saves")


def _last_written(saves: list, latest: int, rank: int) -> dict | None:
    """The state that the last save of iteration `latest` which returned wrote on `rank` (None: no save did):
    save(5) of rank_value(rank, 5) first, then the saves of `_save_old_iterations`, each of rank_value(rank, 0)."""
    written = {5: rank_value(rank, 5)}
    written.update({i: rank_value(rank, 0) for i, outcome in saves if outcome == "returned"})
    return written.get(latest)


@pytest.mark.spec("LM-10w")
def test_saves_of_old_iterations_leave_a_checkpoint_that_loads(rank_pool, tmp_path):
    results = rank_pool(2).run(_save_old_iterations, str(tmp_path))
    found = [r.then for r in results]
    latest = found[0].latest
    states = [_last_written(r.saves, latest, rank) for rank, r in enumerate(results)]
    assert None not in states, (
        f"after save(5), then save(5), save(3), save(-1) and a new manager's save(4) (per rank "
        f"{[r.saves for r in results]}): find_latest() per rank {[f.latest for f in found]}, but should report an "
        "iteration that a save which returned wrote"
    )
    assert_found(found, latest, states, f"save(5), then saves of iterations not newer (found {latest})")


@dataclass(frozen=True)
class OtherParameters:
    find_latest: str  # with replication jump 2: "returned", or the class name of what it raised
    error_names_replication: bool
    storage_unchanged: bool
    then_with_the_saves_parameters: Found
    then_without_replication: Found


def _find_with_other_parameters(base):
    before = _listing(base)
    found = attempt(
        manager(base, (2, 2)).find_latest,
        bound=BOUND,
        what="find_latest()",
        hung_fails=True,
        named=(module("ckpt_managers.base_manager").CheckpointingException,),
    )
    return OtherParameters(
        found.text,
        "replication" in found.message.lower(),
        before == _listing(base),
        find_then_load(manager(base, (1, 2))),
        find_then_load(manager(base)),
    )


@pytest.mark.spec("LM-11")
def test_other_replication_parameters_at_load_are_refused(rank_pool, tmp_path):
    base, pool = str(tmp_path), rank_pool(4)
    pool.run(save_values, base, (1, 2), 6)
    results = pool.run(_find_with_other_parameters, base)
    found = [Found(6, "returned", (6, rank, "")) for rank in range(4)]
    assert_each_rank(
        "manager",
        results,
        [OtherParameters("CheckpointingException", True, True, f, f) for f in found],
        per_rank=True,
        call="find_latest() with replication jump 2 after a save with jump 1",
    )
    expected = [rank_value(r, 6) for r in range(4)]
    assert_found([r.then_with_the_saves_parameters for r in results], 6, expected, "load with the save's parameters")
    assert_found([r.then_without_replication for r in results], 6, expected, "load without replication")


@pytest.mark.spec("LM-11w")
def test_other_replication_parameters_at_load_remove_nothing(rank_pool, tmp_path):
    base, pool = str(tmp_path), rank_pool(4)
    pool.run(save_values, base, (1, 2), 6)
    results = pool.run(_find_with_other_parameters, base)
    what = "after find_latest() with replication jump 2 (its answer per rank: {}), {}"
    outcomes = [r.find_latest for r in results]
    assert all(r.storage_unchanged for r in results), what.format(outcomes, "storage changed, but should not")
    expected = [rank_value(r, 6) for r in range(4)]
    for then, how in (
        ("then_with_the_saves_parameters", "the save's parameters"),
        ("then_without_replication", "no replication"),
    ):
        assert_found([getattr(r, then) for r in results], 6, expected, what.format(outcomes, f"a load with {how}"))


def _save_expecting_failure(base, hung_fails=True):
    rank, _ = world()
    # a bound exceeded fails the rank: a rank waits for the failed one
    return attempt(
        manager(base).save, tasd(rank_value(rank, 2)), 2, bound=20, what="save(2)", hung_fails=hung_fails
    ).text


def _unwritable(base):
    """Put a file where rank 1's directory is; returns a function that puts the directory back."""
    away = node_root(base, 1) + ".away"
    os.rename(node_root(base, 1), away)
    with open(node_root(base, 1), "w") as f:  # a file where rank 1's directory should be
        f.write("not a directory")

    def restore():
        os.remove(node_root(base, 1))
        os.rename(away, node_root(base, 1))

    return restore


@pytest.mark.spec("LM-13")
def test_an_unwritable_directory_fails_the_save_on_every_rank(rank_pool, tmp_path):
    base, pool = str(tmp_path), rank_pool(2)
    pool.run(save_values, base, None, 1)
    restore = _unwritable(base)
    try:
        outcomes = pool.run(_save_expecting_failure, base)
    finally:
        restore()
    assert_each_rank("save(2)", outcomes, "CheckpointingException", call="rank 1's storage unwritable")
    results = pool.run(fresh_find_then_load, base, None)
    assert_found(results, 1, [rank_value(r, 1) for r in range(2)], "a save that failed on rank 1")


@pytest.mark.spec("LM-13w")
def test_an_unwritable_directory_fails_the_save_where_it_is(rank_pool, tmp_path):
    base, pool = str(tmp_path), rank_pool(2)
    pool.run(save_values, base, None, 1)
    restore = _unwritable(base)
    try:  # fresh ranks: a rank whose save waits past the bound is left in a collective, and discarded
        outcomes = run_on_ranks(_save_expecting_failure, 2, (base, False), timeout=60)
    finally:
        restore()
    assert outcomes[1] not in ("returned", HUNG), (
        f"save(2) on rank 1, whose directory cannot be written: {outcomes[1]}, but it should raise within 20s"
    )
    assert "returned" not in outcomes, f"save(2) per rank={outcomes}, but no rank may return as if it had saved"
    results = pool.run(fresh_find_then_load, base, None)
    assert_found(results, 1, [rank_value(r, 1) for r in range(2)], "a restart after save(2) failed on rank 1")
