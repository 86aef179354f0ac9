"""LocalCheckpointManager on 2, 4 and 8 gloo ranks, with the suite's CPU TensorAwareStateDict.

Every rank has its own node-local root (see common.py); "losing a node" deletes that root and
restarts the rank processes. Layouts are (replication_jump, replication_factor), None = no replication.
"""

import io
import logging
import os
import tempfile
import time
import warnings
from contextlib import redirect_stderr, redirect_stdout

import pytest
from hypothesis import given
from hypothesis import strategies as st
from torch.distributed.checkpoint import CheckpointException

from spec_tests.harness import strategies, workloads
from spec_tests.harness.asserts import assert_state_dict_equal, bounded
from spec_tests.harness.ranks import world
from spec_tests.local.common import (BOUND, PART_SLACK, PAYLOAD, async_queue, cliques, find_then_load,
                                     fresh_find_then_load, lose_nodes, manager, module, node_root, rank_value, save,
                                     save_values, storage_bytes, tasd)

pytestmark = pytest.mark.needs("local_checkpointing")

LAYOUTS_2 = [pytest.param(None, id="no-replication"), pytest.param((1, 2), id="jump1-factor2")]


def _example_dir(tmp_path) -> str:
    """A fresh base directory per hypothesis example (tmp_path is shared by the examples)."""
    return tempfile.mkdtemp(dir=tmp_path)


def _assert_loaded(results, iteration, states, what):
    """Every rank found `iteration` and loaded exactly states[rank] with part id (iteration, rank, '')."""
    __tracebackhide__ = True
    for rank, (found, outcome) in enumerate(results):
        assert found == iteration, f"rank {rank}: find_latest()={found}, but should be {iteration} [{what}]"
        assert outcome[0] == "loaded", f"rank {rank}: load() raised {outcome[1]} [{what}]"
        assert outcome[2] == (iteration, rank, ""), f"rank {rank}: part id {outcome[2]} [{what}]"
        assert_state_dict_equal(outcome[1], states[rank], call=f"rank {rank}: load() after {what}")


def _assert_nothing_to_load(results, what):
    __tracebackhide__ = True
    for rank, (found, outcome) in enumerate(results):
        assert found == -1, f"rank {rank}: find_latest()={found}, but no checkpoint is complete [{what}]"
        gave = "a state" if outcome[0] == "loaded" else f"{outcome[1]}"
        assert outcome == ("raised", "CheckpointingException"), (
            f"rank {rank}: load() gave {gave}, but should raise CheckpointingException [{what}]")


# ----------------------------------------------------------------------------- rank functions


def _save_and_reload(base, states, layout, mode, iteration):
    rank, _ = world()
    returned = save(manager(base, layout), tasd(states[rank]), iteration, mode)
    return type(returned).__name__, find_then_load(manager(base, layout))


# --------------------------------------------------------------------------------- round trip


@pytest.mark.spec("LM-1", "LM-12")
def test_nothing_saved_means_nothing_found_and_load_refused(rank_pool, tmp_path):
    _assert_nothing_to_load(rank_pool(2).run(fresh_find_then_load, str(tmp_path), None), "empty storage")


def _load_before_find(base):
    rank, _ = world()
    save(manager(base), tasd(rank_value(rank, 1)), 1)
    try:
        manager(base).load()
        return "loaded"
    except Exception as exc:
        return type(exc).__name__


@pytest.mark.spec("LM-12")
def test_load_before_find_latest_is_refused(rank_pool, tmp_path):
    outcomes = rank_pool(2).run(_load_before_find, str(tmp_path))
    assert outcomes == ["CheckpointingException"] * 2, f"load() without find_latest() gave {outcomes}"


@pytest.mark.spec("LM-2", "LM-3", "LM-5")
@pytest.mark.parametrize("mode", ["sync", pytest.param("temporal", marks=pytest.mark.needs("temporal_caller"))])
@pytest.mark.parametrize("world_size", [2, 4, 8])
@given(data=st.data())
def test_every_rank_loads_exactly_what_it_saved(rank_pool, tmp_path, world_size, mode, data):
    layout = data.draw(strategies.replication_params(world_size), label="(jump, factor)")
    states = data.draw(st.lists(strategies.state_dicts(max_leaves=4), min_size=world_size, max_size=world_size),
                       label="state per rank")
    iteration = data.draw(st.integers(0, 10**6), label="iteration")
    results = rank_pool(world_size).run(_save_and_reload, _example_dir(tmp_path), states, layout, mode, iteration)
    returned = {r[0] for r in results}
    assert returned == {"NoneType" if mode == "sync" else "AsyncRequest"}, f"save() returned {returned}"
    _assert_loaded([r[1] for r in results], iteration, states, f"save({iteration}) {mode}, layout {layout}")


@pytest.mark.spec("LM-2", "LM-3")
@pytest.mark.needs("persistent_caller")
def test_an_async_replicated_save_through_a_persistent_queue_loads_back(rank_pool, tmp_path):
    """One example only: each rank starts a worker process (seconds on a small machine)."""
    states = [rank_value(rank, 4) for rank in range(2)]
    results = rank_pool(2).run(_save_and_reload, str(tmp_path), states, (1, 2), "persistent", 4)
    _assert_loaded([r[1] for r in results], 4, states, "persistent queue, replication jump 1 factor 2")


def _caller_after_save(base, layout):
    rank, _ = world()
    state = tasd(rank_value(rank, 1))
    save(manager(base, layout), state, 1)
    return state.is_hollow, state.state_dict


@pytest.mark.spec("LM-15")
@pytest.mark.parametrize("layout", LAYOUTS_2)
def test_save_leaves_the_callers_state_dict_as_it_was(rank_pool, tmp_path, layout):
    for rank, (hollow, state) in enumerate(rank_pool(2).run(_caller_after_save, str(tmp_path), layout)):
        assert not hollow, f"rank {rank}: the caller's TensorAwareStateDict is hollow after save()"
        assert_state_dict_equal(state, rank_value(rank, 1), call=f"rank {rank}: the caller's state after save()")


# ------------------------------------------------------------------------------ async in flight


def _gated_value(rank, gates):
    values = rank_value(rank, 2)
    values["gate"] = workloads.PickleGate(os.path.join(gates, "open"), reached=gates)
    return values


def _wait_for_writers(gates, count):
    deadline = time.monotonic() + BOUND
    while len([name for name in os.listdir(gates) if name.isdigit()]) < count:
        assert time.monotonic() < deadline, f"{count} writers did not reach the gate within {BOUND:g}s"
        time.sleep(0.01)


def _in_flight(base, gates, layout):
    """Save 1; save(2, is_async=True), update the saved tensors in place, schedule the request; its
    writes stop at a gate: once every rank's writer is held there, ask another manager what it finds,
    then open the gate."""
    rank, _ = world()
    mgr = manager(base, layout)
    save(mgr, tasd(rank_value(rank, 1)), 1)
    state = tasd(_gated_value(rank, gates))
    originals = list(state.tensors)  # what training goes on updating (the model's parameters)
    request = bounded(BOUND, "save(is_async=True)", mgr.save, state, 2, is_async=True)
    strategies.mutate_in_place(originals)  # before scheduling: a forked writer would not see it anyway
    calls = async_queue(persistent=False)
    calls.schedule_async_request(request)
    _wait_for_writers(gates, world()[1])
    during = bounded(BOUND, "find_latest()", manager(base, layout).find_latest)
    if rank == 0:
        workloads.open_gate(os.path.join(gates, "open"))
    bounded(BOUND, "maybe_finalize_async_calls(blocking=True)", calls.maybe_finalize_async_calls, True)
    calls.close()
    return during, find_then_load(manager(base, layout))


@pytest.mark.spec("LM-4", "LM-16")
@pytest.mark.needs("temporal_caller")
@pytest.mark.parametrize("layout", LAYOUTS_2)
def test_an_unfinished_part_is_not_counted_and_later_updates_do_not_leak(rank_pool, tmp_path, layout):
    gates = str(tmp_path / "gates")
    os.mkdir(gates)
    results = rank_pool(2).run(_in_flight, str(tmp_path / "ckpt"), gates, layout)
    during = [r[0] for r in results]
    assert during == [1, 1], f"while the parts of iteration 2 were being written, find_latest() gave {during}"
    _assert_loaded([r[1] for r in results], 2, [_gated_value(rank, gates) for rank in range(2)],
                   "async save(2) with in-place updates after it returned")


# ------------------------------------------------------------------------------------- lost nodes


@pytest.mark.spec("LM-5", "LM-6")
@pytest.mark.parametrize("world_size", [4, 8])
@given(data=st.data())
def test_lost_nodes_are_recovered_from_their_cliques_or_refused_everywhere(rank_pool, tmp_path, world_size, data):
    layout = data.draw(strategies.replication_params(world_size), label="(jump, factor)")
    lost = data.draw(st.sets(st.integers(0, world_size - 1), min_size=1), label="lost ranks")
    base, pool = _example_dir(tmp_path), rank_pool(world_size)
    pool.run(save_values, base, layout, 7)
    lose_nodes(base, lost)
    pool.close()  # the next run starts fresh rank processes
    results = pool.run(fresh_find_then_load, base, layout)
    groups = [[r] for r in range(world_size)] if layout is None else cliques(world_size, *layout)
    what = f"layout {layout}, lost {sorted(lost)}"
    if all(set(group) - lost for group in groups):
        _assert_loaded(results, 7, [rank_value(r, 7) for r in range(world_size)], what)
    else:
        _assert_nothing_to_load(results, what + " (a whole clique)")


@pytest.mark.spec("LM-7")
def test_replicas_are_ignored_when_replication_is_disabled_at_load(rank_pool, tmp_path):
    base, pool = str(tmp_path), rank_pool(4)
    pool.run(save_values, base, (1, 2), 3)
    intact = pool.run(fresh_find_then_load, base, None)
    _assert_loaded(intact, 3, [rank_value(r, 3) for r in range(4)], "replicated save, load without replication")
    lose_nodes(base, [1])
    pool.close()
    _assert_nothing_to_load(pool.run(fresh_find_then_load, base, None), "rank 1 lost, load without replication")
    recovered = pool.run(fresh_find_then_load, base, (1, 2))
    _assert_loaded(recovered, 3, [rank_value(r, 3) for r in range(4)], "rank 1 lost, load with replication")


# ----------------------------------------------------------------------------------------- cleanup


def _save_twice(base, first_layout, second_layout):
    save_values(base, first_layout, 1)
    save_values(base, second_layout, 2)


@pytest.mark.spec("LM-8")
@pytest.mark.parametrize("layout", LAYOUTS_2)
def test_a_successful_save_leaves_only_its_own_parts(rank_pool, tmp_path, layout):
    rank_pool(2).run(_save_twice, str(tmp_path), layout, layout)
    parts = 1 if layout is None else layout[1]
    for rank in range(2):
        used = storage_bytes(str(tmp_path), rank)
        assert used <= parts * (PAYLOAD + PART_SLACK), (
            f"rank {rank} stores {used} bytes after save(1), save(2): more than the {parts} part(s) of "
            f"iteration 2 (about {PAYLOAD} bytes each), so older parts were kept")


@pytest.mark.spec("LM-8")
def test_an_older_checkpoint_does_not_come_back(rank_pool, tmp_path):
    """Iteration 1 is replicated, iteration 2 is not: once node 0 is lost only 1 could still be
    recovered, had it been kept."""
    base, pool = str(tmp_path), rank_pool(2)
    pool.run(_save_twice, base, (1, 2), None)
    lose_nodes(base, [0])
    pool.close()
    results = pool.run(fresh_find_then_load, base, (1, 2))
    _assert_nothing_to_load(results, "save(1) replicated, save(2) not, node 0 lost")


# --------------------------------------------------------------------------------------- failures


def _failing_async_save(base, layout):
    rank, _ = world()
    save(manager(base, layout), tasd(rank_value(rank, 1)), 1)
    values = rank_value(rank, 2)
    if rank == 1:
        values["poison"] = workloads.PickleFails("rank 1 cannot write its part")
    calls = async_queue(persistent=False)
    mgr = manager(base, layout)
    try:
        calls.schedule_async_request(bounded(BOUND, "save(is_async=True)", mgr.save, tasd(values), 2, is_async=True))
        bounded(BOUND, "maybe_finalize_async_calls(blocking=True)", calls.maybe_finalize_async_calls, True)
        outcome = "finalized"
    except CheckpointException:
        outcome = "CheckpointException"
    except module("ckpt_managers.base_manager").CheckpointingException:
        outcome = "CheckpointingException"
    calls.close()
    return outcome, find_then_load(manager(base, layout))


@pytest.mark.spec("LM-9")
@pytest.mark.needs("temporal_caller")
@pytest.mark.parametrize("layout", LAYOUTS_2)
def test_a_failed_save_raises_everywhere_and_keeps_the_last_checkpoint(rank_pool, tmp_path, layout):
    results = rank_pool(2).run(_failing_async_save, str(tmp_path), layout)
    outcomes = [r[0] for r in results]
    assert all(o in ("CheckpointException", "CheckpointingException") for o in outcomes), (
        f"a save whose write failed on rank 1 ended with {outcomes} per rank")
    _assert_loaded([r[1] for r in results], 1, [rank_value(r, 1) for r in range(2)], "failed save(2)")


def _listing(base):
    rank, _ = world()
    root = node_root(base, rank)
    return sorted((os.path.relpath(os.path.join(d, f), root), os.path.getsize(os.path.join(d, f)))
                  for d, _, files in os.walk(root) for f in files)


def _save_old_iterations(base):
    rank, _ = world()
    mgr = manager(base)
    save(mgr, tasd(rank_value(rank, 5)), 5)
    before, outcomes = _listing(base), []
    for target_mgr, iteration in ((mgr, 5), (mgr, 3), (mgr, -1), (manager(base), 4)):
        try:
            bounded(BOUND, f"save({iteration})", target_mgr.save, tasd(rank_value(rank, 0)), iteration)
            outcomes.append((iteration, "saved"))
        except AssertionError:
            raise
        except Exception as exc:
            outcomes.append((iteration, type(exc).__name__))
    return outcomes, before == _listing(base), find_then_load(manager(base))


@pytest.mark.spec("LM-10")
def test_an_iteration_not_newer_than_the_latest_is_refused(rank_pool, tmp_path):
    results = rank_pool(2).run(_save_old_iterations, str(tmp_path))
    for rank, (outcomes, unchanged, _) in enumerate(results):
        assert all(o == "CheckpointingException" for _, o in outcomes), (
            f"rank {rank}: after save(5), save(iteration) gave {outcomes}; each should raise CheckpointingException")
        assert unchanged, f"rank {rank}: refused saves changed the files in its storage"
    _assert_loaded([r[2] for r in results], 5, [rank_value(r, 5) for r in range(2)], "refused saves")


def _find_with_other_parameters(base):
    errors = module("ckpt_managers.base_manager").CheckpointingException
    before = _listing(base)
    try:
        outcome = ("found", bounded(BOUND, "find_latest()", manager(base, (2, 2)).find_latest))
    except errors as exc:
        outcome = ("raised", "replication" in str(exc).lower())
    return outcome, before == _listing(base), find_then_load(manager(base, (1, 2))), find_then_load(manager(base))


@pytest.mark.spec("LM-11")
def test_other_replication_parameters_at_load_are_refused(rank_pool, tmp_path):
    base, pool = str(tmp_path), rank_pool(4)
    pool.run(save_values, base, (1, 2), 6)
    results = pool.run(_find_with_other_parameters, base)
    for rank, (outcome, unchanged, _, _) in enumerate(results):
        assert outcome == ("raised", True), (
            f"rank {rank}: find_latest() with jump 2 after a save with jump 1 gave {outcome}; it should raise "
            "CheckpointingException naming the replication parameters")
        assert unchanged, f"rank {rank}: the refused find_latest() changed the files in its storage"
    expected = [rank_value(r, 6) for r in range(4)]
    _assert_loaded([r[2] for r in results], 6, expected, "load with the save's parameters")
    _assert_loaded([r[3] for r in results], 6, expected, "load without replication")


def _save_expecting_failure(base):
    rank, _ = world()
    try:
        bounded(20, "save(2)", manager(base).save, tasd(rank_value(rank, 2)), 2)
        return "saved"
    except AssertionError:
        raise  # the bound was exceeded: a rank waits for the failed one
    except Exception as exc:
        return type(exc).__name__


@pytest.mark.spec("LM-13")
def test_an_unwritable_directory_fails_the_save_on_every_rank(rank_pool, tmp_path):
    base, pool = str(tmp_path), rank_pool(2)
    pool.run(save_values, base, None, 1)
    away = node_root(base, 1) + ".away"
    os.rename(node_root(base, 1), away)
    with open(node_root(base, 1), "w") as f:  # a file where rank 1's directory should be
        f.write("not a directory")
    try:
        outcomes = pool.run(_save_expecting_failure, base)
    finally:
        os.remove(node_root(base, 1))
        os.rename(away, node_root(base, 1))
    assert outcomes == ["CheckpointingException"] * 2, f"save with rank 1's storage unwritable gave {outcomes}"
    results = pool.run(fresh_find_then_load, base, None)
    _assert_loaded(results, 1, [rank_value(r, 1) for r in range(2)], "a save that failed on rank 1")


# --------------------------------------------------------------------------------------- logging


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


def _quiet_but_logged(base, layout):
    rank, _ = world()
    root, handler, out, err = logging.getLogger(), _Records(), io.StringIO(), io.StringIO()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        with redirect_stdout(out), redirect_stderr(err), warnings.catch_warnings(record=True):
            save(manager(base, layout), tasd(rank_value(rank, 1)), 1)
            found, _ = find_then_load(manager(base, layout))
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return found, out.getvalue(), err.getvalue(), len(handler.records)


@pytest.mark.spec("LM-14")
@pytest.mark.parametrize("layout", LAYOUTS_2)
def test_the_manager_logs_and_prints_nothing(rank_pool, tmp_path, layout):
    for rank, (found, out, err, records) in enumerate(rank_pool(2).run(_quiet_but_logged, str(tmp_path), layout)):
        assert found == 1, f"rank {rank}: find_latest()={found}"
        assert (out, err) == ("", ""), f"rank {rank} printed stdout={out!r} stderr={err!r}"
        assert records > 0, f"rank {rank}: save, find_latest and load logged no record at DEBUG level"
