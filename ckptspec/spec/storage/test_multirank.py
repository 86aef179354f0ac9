"""Several ranks: each writes its own items, the coordinator alone commits, and errors reach every rank."""

import os
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from ckptspec.spec.drivers import saving
from ckptspec.spec.harness.asserts import HUNG, BoundExceeded, assert_each_rank, assert_state_dict_equal, bounded
from ckptspec.spec.harness.ranks import world
from ckptspec.spec.harness.ranks.vocabulary import RankFailures
from ckptspec.spec.harness.shared_runs import shared

# The temporal caller: a persistent worker per rank would cost more start-up than the tests themselves, and
# what is checked here is the storage protocol between ranks, the same for either caller.
pytestmark = pytest.mark.needs("storage_writer", "temporal_caller")
WORLDS = [pytest.param(2, id="2ranks"), pytest.param(4, id="4ranks")]
ERROR_BOUND = 20.0


def _rank_state(rank):
    return {f"rank{rank}": {"w": torch.full((3,), float(rank)), "i": torch.arange(rank + 2)}, "step": 7}


class Finish(NamedTuple):
    calls: list  # of writer.finish, each with the number of ranks' write results it got
    holds_metadata: bool  # save_state_dict_async_plan returned global metadata


def _save_counting_finish(path, coordinator):
    rank, _ = world()
    writer = saving.module("filesystem_async").FileSystemWriterAsync(path, thread_count=2)
    calls = []
    real_finish = writer.finish

    def finish(metadata, results):
        calls.append(len(results))
        return real_finish(metadata, results)

    writer.finish = finish
    plan_ret = saving.plan(_rank_state(rank), writer, coordinator_rank=coordinator)
    queue = saving.queue(False)
    queue.schedule_async_request(saving.request(writer, plan_ret))
    saving.finalize(queue)
    return Finish(calls, plan_ret[1] is not None)


@pytest.mark.spec("FS-9", "FS-15", "SD-1")
@pytest.mark.parametrize("coordinator", ["first", "last"])
@pytest.mark.parametrize("world_size", WORLDS)
def test_each_rank_writes_its_items_and_only_the_coordinator_commits(rank_pool, tmp_path, world_size, coordinator):
    coordinator = 0 if coordinator == "first" else world_size - 1
    path = str(tmp_path / "ckpt")
    assert_each_rank(
        "finish",
        rank_pool(world_size).run(_save_counting_finish, path, coordinator),
        [Finish([world_size], True) if r == coordinator else Finish([], False) for r in range(world_size)],
        per_rank=True,
        call=f"a save with coordinator_rank={coordinator}",
    )
    storage = saving.read_metadata(path).storage_data
    for rank in range(world_size):
        files = {info.relative_path for index, info in storage.items() if index.fqn.startswith(f"rank{rank}.")}
        assert files, f"rank {rank}'s items are recorded in files {sorted(files)}, not in its own __{rank}_* files"
        assert all(f.startswith(f"__{rank}_") for f in files), (
            f"rank {rank}'s items are recorded in files {sorted(files)}, not in its own __{rank}_* files"
        )
        own = [f for f in saving.data_files(path) if f.startswith(f"__{rank}_")]
        assert len(own) <= 2, f"rank {rank} wrote {own} with thread_count=2"
    expected = {"step": 7}
    for rank in range(world_size):
        expected.update(_rank_state(rank))
    assert_state_dict_equal(saving.load(expected, path), expected, call=f"dcp.load of a {world_size}-rank checkpoint")


def _save_in_two_groups(paths, coordinator):
    """The world as two halves, each saving its own checkpoint with process_group = its half.

    Returns whether the rank holds the global metadata (only a group's coordinator should), or the exception the
    save raised (its repr)."""
    rank, size = world()
    halves = [list(range(size // 2)), list(range(size // 2, size))]
    groups = [dist.new_group(members) for members in halves]  # collective: every rank makes both
    mine = rank // (size // 2)
    writer = saving.module("filesystem_async").FileSystemWriterAsync(paths[mine])
    try:
        plan_ret = saving.plan(_rank_state(rank), writer, process_group=groups[mine], coordinator_rank=coordinator)
        req = saving.request(writer, plan_ret)
        bounded(saving.FINALIZE_BOUND, "AsyncRequest.execute_sync() of a group's save", req.execute_sync)
    except Exception as exc:
        return repr(exc)
    return plan_ret[1] is not None


def _check_group_checkpoint(g, path):
    """Group g's checkpoint (ranks 2g, 2g+1) records exactly the group's items and loads to its state."""
    members = range(2 * g, 2 * g + 2)
    expected = {"step": 7}
    for rank in members:
        expected.update(_rank_state(rank))
    saved = set(saving.read_metadata(path).state_dict_metadata)
    wanted = {"step"} | {f"rank{r}.{k}" for r in members for k in ("w", "i")}
    assert saved == wanted, f"group {g}'s checkpoint records {sorted(saved)}, but should record {sorted(wanted)}"
    assert_state_dict_equal(saving.load(expected, path), expected, call=f"dcp.load of group {g}'s checkpoint")


GROUP_SAVES = "saves of groups [0, 1] and [2, 3], each with process_group=its group, coordinator_rank={}"


@pytest.mark.spec("SD-11")
@pytest.mark.parametrize("coordinator", [0, 1], ids=["group-rank-0", "group-rank-1"])
def test_process_group_scopes_the_save_to_its_ranks(rank_pool, tmp_path, coordinator):
    paths = [str(tmp_path / "group0"), str(tmp_path / "group1")]
    assert_each_rank(
        "holds global metadata",
        rank_pool(4).run(_save_in_two_groups, paths, coordinator),
        [r % 2 == coordinator for r in range(4)],
        per_rank=True,
        call=GROUP_SAVES.format(coordinator),
    )
    for g, path in enumerate(paths):
        _check_group_checkpoint(g, path)


@pytest.mark.spec("SD-11w")
@pytest.mark.parametrize("coordinator", [0, 1], ids=["group-rank-0", "group-rank-1"])
def test_a_group_save_that_returns_everywhere_holds_its_groups_items(rank_pool, tmp_path, coordinator):
    paths = [str(tmp_path / "group0"), str(tmp_path / "group1")]
    outcomes = rank_pool(4).run(_save_in_two_groups, paths, coordinator)
    for g, path in enumerate(paths):
        if all(isinstance(outcomes[r], bool) for r in (2 * g, 2 * g + 1)):  # no rank of the group raised
            assert os.path.exists(os.path.join(path, ".metadata")), (
                f"every rank of group {g} returned from its save ({GROUP_SAVES.format(coordinator)}; per rank: "
                f"{outcomes}), but its checkpoint has no .metadata"
            )
            _check_group_checkpoint(g, path)


def _failing_save(tmp, good, bad):
    """Save `good`, then `bad` (whose last rank's file cannot be created); the second save must raise
    CheckpointException. What the second save did is also recorded in tmp/outcome<rank> ("returned", HUNG or the
    class of what it raised), for FS-10w, which reads it even where a rank failed the run."""
    rank, _ = world()
    saving.async_save(_rank_state(rank), good)
    with pytest.raises(CheckpointException):
        _recording(Path(tmp, f"outcome{rank}"), saving.async_save, _rank_state(rank), bad, bound=ERROR_BOUND)
    return os.path.exists(os.path.join(bad, ".metadata"))


def _recording(record, fn, *args, **kwargs):
    """fn(*args, **kwargs), first writing to `record` what it did: "returned", HUNG or the class it raised."""
    try:
        fn(*args, **kwargs)
    except BoundExceeded:
        record.write_text(HUNG)
        raise
    except BaseException as exc:  # CheckpointException is a BaseException
        record.write_text("CheckpointException" if isinstance(exc, CheckpointException) else type(exc).__name__)
        raise
    record.write_text("returned")


class WriteFailure(NamedTuple):
    tmp: str
    good: str
    bad: str
    committed: list  # each rank's answer (whether .metadata exists); empty where the run failed
    error: RankFailures | None  # how the run failed


def _write_failure(rank_pool, tmp_path_factory, world_size) -> WriteFailure:
    def run():
        tmp = str(tmp_path_factory.mktemp("write-failure"))
        good, bad = os.path.join(tmp, "good"), os.path.join(tmp, "bad")
        os.makedirs(os.path.join(bad, f"__{world_size - 1}_0.distcp"))  # a directory where the last rank writes
        try:
            return WriteFailure(tmp, good, bad, rank_pool(world_size).run(_failing_save, tmp, good, bad), None)
        except RankFailures as exc:
            return WriteFailure(tmp, good, bad, [], exc)

    return shared(tmp_path_factory, f"FS-10-{world_size}", run)


@pytest.mark.spec("FS-10", "FS-11")
@pytest.mark.parametrize("world_size", WORLDS)
def test_a_write_failure_on_one_rank_fails_every_rank_and_commits_nothing(rank_pool, tmp_path_factory, world_size):
    run = _write_failure(rank_pool, tmp_path_factory, world_size)
    if run.error is not None:
        raise run.error
    failing = world_size - 1
    assert not any(run.committed), (
        f"after rank {failing}'s write failed, .metadata exists (seen per rank: {run.committed})"
    )
    expected = {"step": 7}
    for rank in range(world_size):
        expected.update(_rank_state(rank))
    assert_state_dict_equal(saving.load(expected, run.good), expected, call="dcp.load of the earlier checkpoint")


@pytest.mark.spec("FS-10w")
@pytest.mark.parametrize("world_size", WORLDS)
def test_a_write_failure_raises_on_its_rank_and_commits_nothing(rank_pool, tmp_path_factory, world_size):
    run = _write_failure(rank_pool, tmp_path_factory, world_size)
    failing = world_size - 1
    did = [_recorded(run.tmp, rank) for rank in range(world_size)]
    where = f"a save whose rank {failing} cannot create its file (per rank: {did})"
    assert did[failing] not in ("returned", HUNG, NO_ANSWER), f"the failing rank's save did not raise in time: {where}"
    assert "returned" not in did, f"a rank returned from the failed save: {where}"
    assert not os.path.exists(os.path.join(run.bad, ".metadata")), f".metadata exists after {where}"


NO_ANSWER = "no answer"  # the rank was stopped before it recorded anything


def _recorded(tmp, rank):
    record = Path(tmp, f"outcome{rank}")
    return record.read_text() if record.exists() else NO_ANSWER


class _FailingPlanner(DefaultSavePlanner):
    def create_local_plan(self):
        raise RuntimeError("this rank cannot plan")


def _planning_failure(path):
    rank, size = world()
    planner = _FailingPlanner() if rank == size - 1 else DefaultSavePlanner()
    writer = saving.module("filesystem_async").FileSystemWriterAsync(path)
    with pytest.raises(CheckpointException):
        bounded(ERROR_BOUND, "save_state_dict_async_plan", saving.plan, _rank_state(rank), writer, planner=planner)


@pytest.mark.spec("SD-2")
def test_a_planning_error_on_one_rank_raises_on_every_rank(rank_pool, tmp_path):
    path = str(tmp_path / "ckpt")
    rank_pool(2).run(_planning_failure, path)
    written = sorted(os.listdir(path)) if os.path.isdir(path) else []
    assert not written, f"a failed plan left {written} in the checkpoint directory"
