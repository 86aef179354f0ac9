"""Process faults in the async core: a killed rank, a killed worker or writer process, a killed
trainer, and a hung write, each in the phases of a save where it can happen.

Every test saves through `saves.for_target` (DCP through the target's storage writer where it has
one, else the suite's own shard-and-marker save on the bare core), first a previous checkpoint,
then the save that the fault hits.
"""

import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass

import pytest

from ckptspec.faults import saves
from ckptspec.faults.faults import exits_within, kill_pids, kill_self_when, wait_for_pids
from ckptspec.spec.drivers.bounds import BOUND, EXIT_BOUND
from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.drivers.faults.phases import SAVE_PHASES, Hooks, Step
from ckptspec.spec.drivers.faults.tmpdirs import on_ranks
from ckptspec.spec.harness import (
    HUNG,
    RankFailures,
    assert_each_rank,
    async_core,
    bounded,
    close_quietly,
    current_target,
    outcome_of,
    workloads,
    world,
)
from ckptspec.spec.harness.shared_runs import shared

WORLD = 2
VICTIM = 1  # the rank (or the rank whose worker) the fault hits; rank 0 is DCP's coordinator


def _save():
    return saves.for_target(current_target())


def _queue():
    return async_core().AsyncCallsQueue(persistent=True)


def _paths(tmp):
    return os.path.join(tmp, "old"), os.path.join(tmp, "new")


def _writes_hang(tmp, rank, gate=None):
    """A fault-layer plan: the first data write of the new checkpoint (any process) never returns."""
    return faultfs.Plan(
        root=_paths(tmp)[1],
        log=os.path.join(tmp, f"fs{rank}.log"),
        faults=(faultfs.Fault("hang", op="write", gate=gate),),
    )


HANG_WAIT_S = 60


def _hang_fired(log, seconds=HANG_WAIT_S) -> bool:
    """Whether a write hung on the fault layer within `seconds`."""
    deadline = time.monotonic() + seconds
    while not faultfs.fired(log, "hang"):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


def _hung_pids(log, seconds=HANG_WAIT_S):
    """Pids of the processes stuck in a hung write, once there is one."""
    assert _hang_fired(log, seconds), f"no write hung within {seconds:g}s (log {log})"
    return sorted({p.pid for p in faultfs.fired(log, "hang")})


def _skip_plan_without_writer(save, phase):
    if phase == "plan" and save.name == "core":
        pytest.skip("the target has no storage writer, so its saves have no planning phase")


# --------------------------------------------------------------------------------- killed rank


def _save_without_queue(save, path, version, rank, world_size):
    """A save run in the trainer itself, as AsyncRequest.execute_sync would (no worker to start)."""
    request = save.request(path, version, rank, world_size)
    args = list(request.async_fn_args)
    if request.preload_fn is not None:
        args[1] = request.preload_fn()
    request.async_fn(*args, **(request.async_fn_kwargs or {}))
    for fn in request.finalize_fns:
        fn()


def _killed_rank(tmp, phase):
    rank, world_size = world()
    save, queue = _save(), _queue()
    old, new = _paths(tmp)
    _save_without_queue(save, old, 0, rank, world_size)
    hooks = Hooks()
    if rank == VICTIM:
        if phase in ("plan", "finalize"):  # phases that run in the trainer: it dies there
            hooks = Hooks.at(phase, Step(die=True))
        else:  # staging and write run in the worker: the trainer dies once its worker is there
            marker = os.path.join(tmp, "worker-in-phase")
            hooks = Hooks.at(phase, Step(marker=marker, gate=os.path.join(tmp, "never")))
            kill_self_when(marker)
    outcome = outcome_of(
        save.save,
        queue,
        new,
        1,
        rank,
        world_size,
        hooks,
        bound=BOUND,
        what=f"a save during which rank {VICTIM} is killed ({phase})",
    )
    close_quietly(queue, abort=True, bound=EXIT_BOUND)
    return outcome


@pytest.mark.spec("FI-RANK-1", "FI-RANK-2", "FI-RANK-3")
@pytest.mark.needs("persistent_caller")
@pytest.mark.parametrize("phase", SAVE_PHASES)
def test_killed_rank(target, tmp_path, phase):
    save = saves.for_target(target)
    _skip_plan_without_writer(save, phase)
    outcomes = on_ranks(
        WORLD, _killed_rank, str(tmp_path), phase, timeout=180, backend="gloo", expect_exit={VICTIM: -signal.SIGKILL}
    )
    assert outcomes[0] not in ("returned", HUNG), (
        f"rank 0's save, during which rank {VICTIM} was killed ({phase}): {outcomes[0]}; "
        f"it should raise within {BOUND:g}s"
    )
    old, new = _paths(str(tmp_path))
    save.assert_loads(old, 0, WORLD)
    if save.committed(new):
        save.assert_loads(new, 1, WORLD)


# ------------------------------------------------------------------------------- killed worker


@dataclass(frozen=True)
class WorkerKilled:
    outcome: str  # of the save whose worker (or writer process) was killed
    recovered: str  # of a save with a new queue afterwards, or "not tried"


def _killed_worker(tmp, phase):
    rank, world_size = world()
    save, queue = _save(), _queue()
    hooks = Hooks()
    if rank == VICTIM and phase == "writer":  # a writer process the worker started dies mid-write
        fault = faultfs.Fault("die", op="write", in_child=True)
        plan = faultfs.Plan(root=_paths(tmp)[1], log=_victim_log(tmp), faults=(fault,))
        hooks = Hooks.at("write", Step(fs=plan))
    elif rank == VICTIM:
        hooks = Hooks.at(phase, Step(die=True))
    outcome = outcome_of(
        save.save,
        queue,
        _paths(tmp)[1],
        1,
        rank,
        world_size,
        hooks,
        bound=BOUND,
        what=f"a save whose worker on rank {VICTIM} is killed ({phase})",
    )
    close_quietly(queue, abort=True, bound=EXIT_BOUND)
    if outcome == HUNG or phase != "write":
        return WorkerKilled(outcome, "not tried")
    again = _queue()
    recovered = outcome_of(
        save.save,
        again,
        os.path.join(tmp, "again"),
        2,
        rank,
        world_size,
        bound=BOUND,
        what="a save with a new queue after the worker failure",
    )
    close_quietly(
        again, abort=True, bound=EXIT_BOUND
    )  # how the queue ends is not this test's subject; abort is the quick way
    return WorkerKilled(outcome, recovered)


def _victim_log(tmp):
    return os.path.join(tmp, f"fs{VICTIM}.log")


def _worker_killed(tmp_path_factory, phase: str) -> tuple[str, list]:
    """The run of a save whose worker (or writer process) is killed in `phase`: (its directory, each rank's
    WorkerKilled), made once per session for FI-WORKER-1 and its weak level."""

    def make():
        tmp = str(tmp_path_factory.mktemp(f"worker-killed-{phase}"))
        return tmp, on_ranks(WORLD, _killed_worker, tmp, phase, timeout=180)

    return shared(tmp_path_factory, f"worker-killed-{phase}", make)


def _skip_unless_the_writer_died(tmp, phase):
    if phase == "writer" and not faultfs.fired(_victim_log(tmp), "die"):
        pytest.skip("the target wrote the data without a writer process of its own to kill")


@pytest.mark.spec("FI-WORKER-1")
@pytest.mark.needs("persistent_caller")
@pytest.mark.parametrize("phase", ["staging", pytest.param("writer", id="write-child")])
def test_killed_worker(target, tmp_path_factory, phase):
    _check_killed_worker(target, tmp_path_factory, phase)


@pytest.mark.spec("FI-WORKER-1", "FI-WORKER-2")
@pytest.mark.needs("persistent_caller")
@pytest.mark.parametrize("phase", ["write"])
def test_killed_worker_then_a_new_queue_saves(target, tmp_path_factory, phase):
    _check_killed_worker(target, tmp_path_factory, phase)


def _check_killed_worker(target, tmp_path_factory, phase):
    save = saves.for_target(target)
    tmp, outcomes = _worker_killed(tmp_path_factory, phase)
    _skip_unless_the_writer_died(tmp, phase)
    assert [o.outcome for o in outcomes] == ["CheckpointException"] * WORLD, (
        f"outcome of the failed save per rank: {[o.outcome for o in outcomes]}"
    )
    assert not save.committed(_paths(tmp)[1]), f"the save whose worker died was committed ({save.MARKER} exists)"
    if phase == "write":
        assert [o.recovered for o in outcomes] == ["returned"] * WORLD, (
            f"saving again with a new queue: {[o.recovered for o in outcomes]}"
        )
        save.assert_loads(os.path.join(tmp, "again"), 2, WORLD)


@pytest.mark.spec("FI-WORKER-1w")
@pytest.mark.needs("persistent_caller")
@pytest.mark.parametrize("phase", ["staging", pytest.param("writer", id="write-child"), "write"])
def test_killed_worker_save_never_passes_for_saved(target, tmp_path_factory, phase):
    save = saves.for_target(target)
    tmp, outcomes = _worker_killed(tmp_path_factory, phase)
    _skip_unless_the_writer_died(tmp, phase)
    per_rank = [o.outcome for o in outcomes]
    assert "returned" not in per_rank, (
        f"a save whose worker on rank {VICTIM} was killed ({phase}) returned without an error: outcome per rank "
        f"{per_rank}"
    )
    assert not save.committed(_paths(tmp)[1]), (
        f"a save whose worker on rank {VICTIM} was killed ({phase}) was committed ({save.MARKER} exists): "
        f"outcome per rank {per_rank}"
    )


# ------------------------------------------------------------------------------ killed trainer


@dataclass(frozen=True)
class TrainerKilled:
    worker: int  # pid of the trainer's worker
    writers: list  # pids of the writer processes hung in a write, the worker excluded
    survivors: list  # of those, the pids still running EXIT_BOUND after the trainer was killed


def _trainer_killed(tmp, phase):
    """Plan here, fork a trainer that schedules the save, kill it once its worker is in `phase`."""
    save = _save()
    marker = os.path.join(tmp, "worker")
    if phase == "staging":
        hooks = Hooks.at("staging", Step(marker=marker, gate=os.path.join(tmp, "never")))
    else:
        hooks = Hooks.at("write", Step(marker=marker, fs=_writes_hang(tmp, 0)))
    request = save.request(_paths(tmp)[1], 1, 0, 1, hooks)
    trainer = os.fork()
    if trainer == 0:  # the trainer: schedules, then waits to be killed (no collective after fork)
        try:
            queue = _queue()
            queue.schedule_async_request(request)
            time.sleep(workloads.GATE_TIMEOUT)
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(1)
    log = os.path.join(tmp, "fs0.log")
    try:
        worker = wait_for_pids(marker)[0]
        fired = phase != "write" or _hang_fired(log)
        writers = _hung_pids(log) if phase == "write" and fired else []
    finally:
        os.kill(trainer, signal.SIGKILL)
        os.waitpid(trainer, 0)
    if not fired:  # the trainer was killed with no write in flight: nothing to judge
        kill_pids([worker])  # started by the trainer we started: ours to clean up
        pytest.skip(
            f"not judged: the injected write hang never fired within {HANG_WAIT_S} s, so the target writes from a "
            "process the fault layer does not reach (started with spawn)"
        )
    writers = [w for w in writers if w != worker]
    survivors = exits_within([worker, *writers], EXIT_BOUND)
    kill_pids(survivors)  # started by the trainer we started: ours to clean up
    return TrainerKilled(worker, writers, survivors)


@pytest.mark.spec("FI-TRAINER-1")
@pytest.mark.needs("persistent_caller")
@pytest.mark.parametrize("phase", ["staging", "write"])
def test_killed_trainer_takes_its_worker_and_writers_along(tmp_path, phase):
    (killed,) = on_ranks(1, _trainer_killed, str(tmp_path), phase, timeout=90, backend="gloo")
    assert not killed.survivors, (
        f"{len(killed.survivors)} process(es) still run {EXIT_BOUND:g}s after their trainer was killed ({phase}): "
        f"{killed.survivors} (worker {killed.worker}, writer processes {killed.writers})"
    )


# --------------------------------------------------------------------------------- hung writer


def _on_ranks_with_a_hung_write(fn, tmp):
    """on_ranks(WORLD, fn, tmp), judged only where the injected hang fired: the fault layer does not reach writer
    processes started with spawn (faultfs), and a hang that never happened leaves the victim waiting for it and the
    other rank in a collective poll, which says nothing about the target. Such a run is skipped, saying so."""
    try:
        return on_ranks(WORLD, fn, tmp, timeout=90)
    except RankFailures:
        if not faultfs.fired(os.path.join(tmp, f"fs{VICTIM}.log"), "hang"):
            pytest.skip(
                "not judged: the injected hang never fired, so the target writes from a process the fault layer "
                "does not reach (started with spawn)"
            )
        raise


@dataclass(frozen=True)
class HungAborted:
    early: list  # what a non-blocking finalize with the write hung returned
    aborted: str  # outcome of close(abort=True)
    survivors: list  # pids of the hung save's processes still running EXIT_BOUND after the abort


def _hung_then_aborted(tmp):
    rank, world_size = world()
    save, queue = _save(), _queue()
    hooks = (
        Hooks.at("write", Step(marker=os.path.join(tmp, "worker"), fs=_writes_hang(tmp, rank)))
        if rank == VICTIM
        else Hooks()
    )
    queue.schedule_async_request(save.request(_paths(tmp)[1], 1, rank, world_size, hooks))
    hung = []
    if rank == VICTIM:
        hung = sorted({*wait_for_pids(os.path.join(tmp, "worker")), *_hung_pids(os.path.join(tmp, f"fs{rank}.log"))})
    early = bounded(BOUND, "maybe_finalize_async_calls(blocking=False)", queue.maybe_finalize_async_calls, False)
    aborted = outcome_of(queue.close, abort=True, bound=EXIT_BOUND, what="close(abort=True) with a hung write")
    survivors = exits_within(hung, EXIT_BOUND)
    kill_pids(survivors)
    return HungAborted(early, aborted, survivors)


@pytest.mark.spec("FI-HANG-1", "FI-HANG-2")
@pytest.mark.needs("persistent_caller")
@pytest.mark.parametrize("phase", ["write"])
def test_abort_ends_a_hung_write(tmp_path, phase):
    assert_each_rank(
        "hung write",
        _on_ranks_with_a_hung_write(_hung_then_aborted, str(tmp_path)),
        HungAborted(early=[], aborted="returned", survivors=[]),
        call=f"rank {VICTIM}'s write hangs; a non-blocking finalize, then close(abort=True)",
    )


@dataclass(frozen=True)
class HungReleased:
    early: list  # what a non-blocking finalize with the write hung returned
    waiting: bool  # whether a blocking finalize was still waiting 0.5s into the hung write
    result: object  # what the blocking finalize gave once the write was released (or why it did not)


def _hung_then_released(tmp):
    rank, world_size = world()
    save, queue = _save(), _queue()
    gate = os.path.join(tmp, "storage-answers-again")
    hooks = Hooks.at("write", Step(fs=_writes_hang(tmp, rank, gate))) if rank == VICTIM else Hooks()
    queue.schedule_async_request(save.request(_paths(tmp)[1], 1, rank, world_size, hooks))
    if rank == VICTIM:
        _hung_pids(os.path.join(tmp, f"fs{rank}.log"))
    early = bounded(BOUND, "maybe_finalize_async_calls(blocking=False)", queue.maybe_finalize_async_calls, False)
    box = {}

    def finalize():
        try:
            box["done"] = queue.maybe_finalize_async_calls(True)
        except BaseException as exc:
            box["done"] = f"{type(exc).__name__}: {exc}"

    waiter = threading.Thread(target=finalize, name="blocking-finalize", daemon=True)
    waiter.start()
    waiter.join(0.5)  # a blocking finalize must still be waiting while the write hangs
    waiting = waiter.is_alive()
    if rank == VICTIM:
        workloads.open_gate(gate)
    waiter.join(BOUND)
    result = box.get("done", f"still waiting {BOUND:g}s after the write was released")
    close_quietly(queue, abort=True, bound=EXIT_BOUND)
    return HungReleased(early, waiting, result)


@pytest.mark.spec("FI-HANG-2")
@pytest.mark.needs("persistent_caller")
@pytest.mark.parametrize("phase", ["write"])
def test_blocking_finalize_waits_out_a_hung_write(target, tmp_path, phase):
    assert_each_rank(
        "hung write",
        _on_ranks_with_a_hung_write(_hung_then_released, str(tmp_path)),
        HungReleased(early=[], waiting=True, result=[0]),
        call=f"rank {VICTIM}'s write hangs; a non-blocking finalize, a blocking one, then the write is released",
    )
    saves.for_target(target).assert_loads(_paths(str(tmp_path))[1], 1, WORLD)
