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
from dataclasses import dataclass, field

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptspec.spec.drivers.local import (
    BOUND,
    PART_SLACK,
    PAYLOAD,
    Found,
    assert_found,
    assert_nothing_found,
    cliques,
    find_then_load,
    fresh_find_then_load,
    lose_nodes,
    manager,
    rank_value,
    save,
    save_values,
    storage_bytes,
    tasd,
)
from ckptspec.spec.harness import strategies, workloads
from ckptspec.spec.harness.asserts import assert_each_rank, assert_state_dict_equal, attempt, bounded
from ckptspec.spec.harness.processes import async_core
from ckptspec.spec.harness.ranks import world

pytestmark = pytest.mark.needs("local_checkpointing")

LAYOUTS_2 = [pytest.param(None, id="no-replication"), pytest.param((1, 2), id="jump1-factor2")]


def _example_dir(tmp_path) -> str:
    """A fresh base directory per hypothesis example (tmp_path is shared by the examples)."""
    return tempfile.mkdtemp(dir=tmp_path)


# --------------------------------------------------------------------------------- round trip


@dataclass(frozen=True)
class SavedThenFound:
    save_returned: str  # the class name of what save() returned
    then: Found  # a new manager's find_latest() and load()


def _save_and_reload(base, states, layout, mode, iteration):
    rank, _ = world()
    returned = save(manager(base, layout), tasd(states[rank]), iteration, mode)
    return SavedThenFound(type(returned).__name__, find_then_load(manager(base, layout)))


@pytest.mark.spec("LM-1", "LM-12")
def test_nothing_saved_means_nothing_found_and_load_refused(rank_pool, tmp_path):
    assert_nothing_found(rank_pool(2).run(fresh_find_then_load, str(tmp_path), None), "empty storage")


def _load_before_find(base):
    rank, _ = world()
    save(manager(base), tasd(rank_value(rank, 1)), 1)
    return attempt(manager(base).load).text


@pytest.mark.spec("LM-12")
def test_load_before_find_latest_is_refused(rank_pool, tmp_path):
    assert_each_rank(
        "load()",
        rank_pool(2).run(_load_before_find, str(tmp_path)),
        "CheckpointingException",
        call="a new manager's load() without find_latest(), after save(1)",
    )


@pytest.mark.spec("LM-2", "LM-3", "LM-5")
@pytest.mark.parametrize("mode", ["sync", pytest.param("temporal", marks=pytest.mark.needs("temporal_caller"))])
@pytest.mark.parametrize("world_size", [2, 4, 8])
@given(data=st.data())
def test_every_rank_loads_exactly_what_it_saved(rank_pool, tmp_path, world_size, mode, data):
    layout = data.draw(strategies.replication_params(world_size), label="(jump, factor)")
    states = data.draw(
        st.lists(strategies.state_dicts(max_leaves=4), min_size=world_size, max_size=world_size), label="state per rank"
    )
    iteration = data.draw(st.integers(0, 10**6), label="iteration")
    results = rank_pool(world_size).run(_save_and_reload, _example_dir(tmp_path), states, layout, mode, iteration)
    what = f"save({iteration}) {mode}, layout {layout}"
    assert_each_rank(
        "save_returned", [r.save_returned for r in results], "NoneType" if mode == "sync" else "AsyncRequest", call=what
    )
    assert_found([r.then for r in results], iteration, states, what)


@pytest.mark.spec("LM-2", "LM-3")
@pytest.mark.needs("persistent_caller")
def test_an_async_replicated_save_through_a_persistent_queue_loads_back(rank_pool, tmp_path):
    """One example only: each rank starts a worker process (seconds on a small machine)."""
    states = [rank_value(rank, 4) for rank in range(2)]
    results = rank_pool(2).run(_save_and_reload, str(tmp_path), states, (1, 2), "persistent", 4)
    assert_found([r.then for r in results], 4, states, "persistent queue, replication jump 1 factor 2")


@dataclass(frozen=True)
class CallersState:
    is_hollow: bool
    state_dict: dict = field(compare=False)


def _caller_after_save(base, layout):
    rank, _ = world()
    state = tasd(rank_value(rank, 1))
    save(manager(base, layout), state, 1)
    return CallersState(state.is_hollow, state.state_dict)


@pytest.mark.spec("LM-15")
@pytest.mark.parametrize("layout", LAYOUTS_2)
def test_save_leaves_the_callers_state_dict_as_it_was(rank_pool, tmp_path, layout):
    results = rank_pool(2).run(_caller_after_save, str(tmp_path), layout)
    assert_each_rank("caller's TensorAwareStateDict", results, CallersState(False, {}), call="after save()")
    for rank, got in enumerate(results):
        assert_state_dict_equal(
            got.state_dict, rank_value(rank, 1), call=f"rank {rank}: the caller's state after save()"
        )


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


@dataclass(frozen=True)
class InFlight:
    find_latest_during: int  # a new manager's, while every rank's part of iteration 2 is held at a gate
    then: Found


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
    calls = async_core().AsyncCallsQueue(persistent=False)
    calls.schedule_async_request(request)
    _wait_for_writers(gates, world()[1])
    during = bounded(BOUND, "find_latest()", manager(base, layout).find_latest)
    if rank == 0:
        workloads.open_gate(os.path.join(gates, "open"))
    bounded(BOUND, "maybe_finalize_async_calls(blocking=True)", calls.maybe_finalize_async_calls, True)
    calls.close()
    return InFlight(during, find_then_load(manager(base, layout)))


@pytest.mark.spec("LM-4", "LM-16")
@pytest.mark.needs("temporal_caller")
@pytest.mark.parametrize("layout", LAYOUTS_2)
def test_an_unfinished_part_is_not_counted_and_later_updates_do_not_leak(rank_pool, tmp_path, layout):
    gates = str(tmp_path / "gates")
    os.mkdir(gates)
    results = rank_pool(2).run(_in_flight, str(tmp_path / "ckpt"), gates, layout)
    assert_each_rank(
        "find_latest_during",
        [r.find_latest_during for r in results],
        1,
        call="while the parts of iteration 2 were being written",
    )
    assert_found(
        [r.then for r in results],
        2,
        [_gated_value(rank, gates) for rank in range(2)],
        "async save(2) with in-place updates after it returned",
    )


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
        assert_found(results, 7, [rank_value(r, 7) for r in range(world_size)], what)
    else:
        assert_nothing_found(results, what + " (a whole clique)")


@pytest.mark.spec("LM-7")
def test_replicas_are_ignored_when_replication_is_disabled_at_load(rank_pool, tmp_path):
    base, pool = str(tmp_path), rank_pool(4)
    pool.run(save_values, base, (1, 2), 3)
    intact = pool.run(fresh_find_then_load, base, None)
    assert_found(intact, 3, [rank_value(r, 3) for r in range(4)], "replicated save, load without replication")
    lose_nodes(base, [1])
    pool.close()
    assert_nothing_found(pool.run(fresh_find_then_load, base, None), "rank 1 lost, load without replication")
    recovered = pool.run(fresh_find_then_load, base, (1, 2))
    assert_found(recovered, 3, [rank_value(r, 3) for r in range(4)], "rank 1 lost, load with replication")


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
            f"iteration 2 (about {PAYLOAD} bytes each), so older parts were kept"
        )


@pytest.mark.spec("LM-8")
def test_an_older_checkpoint_does_not_come_back(rank_pool, tmp_path):
    """Iteration 1 is replicated, iteration 2 is not: once node 0 is lost only 1 could still be
    recovered, had it been kept."""
    base, pool = str(tmp_path), rank_pool(2)
    pool.run(_save_twice, base, (1, 2), None)
    lose_nodes(base, [0])
    pool.close()
    results = pool.run(fresh_find_then_load, base, (1, 2))
    assert_nothing_found(results, "save(1) replicated, save(2) not, node 0 lost")


# --------------------------------------------------------------------------------------- logging


class _Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@dataclass(frozen=True)
class Quiet:
    find_latest: int
    stdout: str
    stderr: str
    log_records: int  # at DEBUG level, of save, find_latest and load


def _quiet_but_logged(base, layout):
    rank, _ = world()
    root, handler, out, err = logging.getLogger(), _Records(), io.StringIO(), io.StringIO()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    try:
        with redirect_stdout(out), redirect_stderr(err), warnings.catch_warnings(record=True):
            save(manager(base, layout), tasd(rank_value(rank, 1)), 1)
            found = find_then_load(manager(base, layout)).latest
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return Quiet(found, out.getvalue(), err.getvalue(), len(handler.records))


@pytest.mark.spec("LM-14")
@pytest.mark.parametrize("layout", LAYOUTS_2)
def test_the_manager_logs_and_prints_nothing(rank_pool, tmp_path, layout):
    results = rank_pool(2).run(_quiet_but_logged, str(tmp_path), layout)
    call = "save(1), find_latest(), load()"
    assert_each_rank(
        "manager", [Quiet(r.find_latest, r.stdout, r.stderr, 0) for r in results], Quiet(1, "", "", 0), call=call
    )
    for rank, got in enumerate(results):
        assert got.log_records > 0, f"rank {rank}: manager.log_records={got.log_records}, but should be > 0 [{call}]"
