"""Failures reach every rank, and every wait has a bound: a write that fails on one rank (P-ERROR-1), a rank
killed with a save in flight (P-BOUND-1), storage that stops answering (P-BOUND-2).

The faults are placed in the checkpoint directory itself, so they reach a writer in any process (a thread, a
forked or a spawned worker): a directory where a rank's data file `__<rank>_0.distcp` is to be created makes
its open fail; a FIFO there makes its open block until someone reads it (storage that hangs). A format without a
commit marker moves each data file in whole from elsewhere, and a move onto a directory puts the file inside it:
there the write is failed instead by the injected file-system layer (ckptspec.spec.drivers.faults.faultfs: EIO on the move
into place and on the copy a failed move falls back to), in the failing rank's process and its threads; where
that layer never fired, the test skips saying so.
"""

import errno
import os
import signal

import pytest

from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.drivers.protocol_saves import (
    BOUND,
    EXIT_BOUND,
    assert_loads,
    committed,
    data_file,
    expected,
    fifo_data_file,
    rank_state,
    release,
    save_outcome,
    start,
    warm_saver,
)
from ckptspec.spec.harness.asserts import HUNG, attempt
from ckptspec.spec.harness.ranks import run_on_ranks, world
from ckptspec.spec.harness.surface.loading import checkpoint_format

pytestmark = pytest.mark.needs("protocol")


def _moved_in() -> bool:
    """Whether the target's format moves each data file in whole (no commit marker): see the module docstring."""
    return checkpoint_format().marker is None


def _outcome_with_failing_move(path, failing_rank, log):
    """save_outcome; on `failing_rank`, the move of its data file into place and the copy fallback raise EIO."""
    if world()[0] != failing_rank:
        return save_outcome(path)
    name = "*" + os.path.basename(data_file(path, failing_rank))  # a move is logged as "<from>-><to>"
    faults = tuple(faultfs.Fault("raise", errno=errno.EIO, op=op, name=name) for op in ("rename", "open"))
    with faultfs.installed(faultfs.Plan(root=path, log=log, faults=faults)):
        return save_outcome(path)


@pytest.mark.spec("P-ERROR-1")
@pytest.mark.parametrize("failing_rank", [0, 1])
def test_a_write_failing_on_one_rank_fails_the_save_on_every_rank(tmp_path, failing_rank):
    path, log = str(tmp_path / "c"), str(tmp_path / "faultfs.log")
    if _moved_in():
        os.makedirs(path)
        outcomes = run_on_ranks(_outcome_with_failing_move, 2, (path, failing_rank, log), timeout=120)
        if not (os.path.exists(log) and faultfs.fired(log, "raise")):
            pytest.skip("the injected layer saw no move of the rank's data file into place: no write failed")
    else:
        os.makedirs(data_file(path, failing_rank))  # that rank's data file cannot be created
        outcomes = run_on_ranks(save_outcome, 2, (path,), timeout=120)
    listing = sorted(os.listdir(path))
    wrong = {r: str(o) for r, o in enumerate(outcomes) if o.returned or o.text == HUNG}
    assert not wrong, (
        f"rank {failing_rank}'s data file could not be created, but the save on ranks {sorted(wrong)} "
        f"returned or hung: {wrong} (directory: {listing})"
    )
    assert not committed(path, 2), f"a save that failed on rank {failing_rank} was committed: {listing}"


def _die_or_wait(path):
    rank, _ = world()
    saver = warm_saver(path)
    handle = start(saver, rank_state(rank, 1, 1 << 20), path)
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return attempt(handle.wait, bound=BOUND, what="wait()")


@pytest.mark.spec("P-BOUND-1")
def test_a_rank_killed_mid_save_fails_the_save_on_the_survivors_within_the_bound(tmp_path):
    path = str(tmp_path / "c")
    outcome = run_on_ranks(_die_or_wait, 2, (path,), timeout=120, expect_exit={1: -signal.SIGKILL})[0]
    assert not outcome.returned, (
        f"wait() on rank 0 after rank 1 was killed mid-save: {outcome}, but should raise within {BOUND:g}s"
    )
    assert outcome.text != HUNG, (
        f"wait() on rank 0 after rank 1 was killed mid-save: {outcome}, but should raise within {BOUND:g}s"
    )
    if committed(path, 2):  # rank 1 may have written all its data before it died: then it must load exactly
        assert_loads(path, expected(2, 1, 1 << 20), call="loading a save committed although rank 1 was killed in it")


def _abort_hung(path):
    rank, _ = world()
    saver = warm_saver(path)
    handle = start(saver, rank_state(rank, 1), path)
    aborted = attempt(handle.abort, bound=EXIT_BOUND, what="abort()")
    waited = attempt(handle.wait, bound=BOUND, what="wait() after abort()") if aborted.returned else None
    return aborted, waited


@pytest.mark.spec("P-BOUND-2")
def test_abort_returns_within_the_bound_when_the_storage_hangs(tmp_path):
    path = str(tmp_path / "c")
    os.makedirs(path)
    os.mkfifo(fifo_data_file(path))  # rank 0's data file: its open blocks until a reader comes
    try:
        results = run_on_ranks(_abort_hung, 2, (path,), timeout=120)
    finally:
        release(data_file(path, 0))
    for rank, (aborted, waited) in enumerate(results):
        assert aborted.returned, f"abort() on rank {rank} while a write hangs: {aborted}, but should return"
        assert waited.text != HUNG, f"wait() on rank {rank} after abort(): {waited}, but should return or raise"
