"""Failures reach every rank, and every wait has a bound: a write that fails on one rank (P-ERROR-1), a rank
killed with a save in flight (P-BOUND-1), storage that stops answering (P-BOUND-2).

The faults are placed in the checkpoint directory itself, so they reach a writer in any process (a thread, a
forked or a spawned worker): a directory where a rank's data file `__<rank>_0.distcp` is to be created makes
its open fail; a FIFO there makes its open block until someone reads it (storage that hangs).
"""

import os
import signal

import pytest

from spec_tests.drivers.protocol_saves import (
    BOUND,
    EXIT_BOUND,
    assert_loads,
    committed,
    data_file,
    expected,
    rank_state,
    release,
    save_outcome,
    start,
    warm_saver,
)
from spec_tests.harness.asserts import HUNG, attempt
from spec_tests.harness.ranks import run_on_ranks, world

pytestmark = pytest.mark.needs("protocol")


@pytest.mark.spec("P-ERROR-1")
@pytest.mark.parametrize("failing_rank", [0, 1])
def test_a_write_failing_on_one_rank_fails_the_save_on_every_rank(tmp_path, failing_rank):
    path = str(tmp_path / "c")
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
    os.mkfifo(data_file(path, 0))  # rank 0's data file: its open blocks until a reader comes
    try:
        results = run_on_ranks(_abort_hung, 2, (path,), timeout=120)
    finally:
        release(data_file(path, 0))
    for rank, (aborted, waited) in enumerate(results):
        assert aborted.returned, f"abort() on rank {rank} while a write hangs: {aborted}, but should return"
        assert waited.text != HUNG, f"wait() on rank {rank} after abort(): {waited}, but should return or raise"
