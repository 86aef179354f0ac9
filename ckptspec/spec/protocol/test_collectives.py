"""The trainer's own collectives while saves are in flight (P-COLL-1): dist.barrier() and dist.all_reduce() on the
default process group return on every rank, with the right sum, between start() and wait() of one save, and of
two saves started back to back. A library whose background save runs collectives on the trainer's group can
deadlock them or mix them with its own (KempnerForge issue 104); each collective has its bound, so a hang is
reported by the rank and the collective that hung."""

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException  # a BaseException, not an Exception

from ckptspec.spec.drivers.protocol_saves import BOUND, rank_state, start, warm_saver
from ckptspec.spec.harness.asserts import attempt, bounded
from ckptspec.spec.harness.ranks import run_on_ranks, world

pytestmark = pytest.mark.needs("protocol")
NUMEL = 1 << 20  # 4 MiB per rank and save: the saves are still in flight while the trainer's collectives run


def _trainer_collectives(when: str) -> str | None:
    """The trainer's barrier, then its all-reduce of rank + 1, each within BOUND (a hang raises BoundExceeded,
    naming `when`): what is wrong with the sum, or None."""
    rank, size = world()
    bounded(BOUND, f"dist.barrier() {when}", dist.barrier)
    value = torch.tensor([float(rank + 1)])
    bounded(BOUND, f"dist.all_reduce() {when}", dist.all_reduce, value)
    want = size * (size + 1) / 2
    return None if value.item() == want else f"dist.all_reduce() {when} gave {value.item()} on rank {rank}, not {want}"


def _finish(handle) -> None:
    """Wait for a save; how it ends is other clauses' matter (P-ERROR-*, P-ISO-1), so it is only bounded here."""
    attempt(handle.wait, bound=BOUND, what="wait()")


def _collectives_during_saves(tmp: str) -> list[str]:
    rank, _ = world()
    saver = warm_saver(f"{tmp}/warm")
    problems = []
    try:
        state = rank_state(rank, 1, NUMEL)
        handle = start(saver, state, f"{tmp}/one")
        problems.append(_trainer_collectives("while one save was in flight"))
        _finish(handle)
        first = start(saver, state, f"{tmp}/first")
        second = attempt(start, saver, state, f"{tmp}/second", bound=BOUND, what="start() of the second save")
        problems.append(_trainer_collectives("while two saves started back to back were in flight"))
        _finish(first)
        if second.returned:
            _finish(second.value)
    finally:
        attempt(saver.close, bound=BOUND, what="close()", named=(CheckpointException,))
    return [p for p in problems if p]


@pytest.mark.spec("P-COLL-1")
def test_the_trainers_collectives_return_while_saves_are_in_flight(tmp_path):
    problems = run_on_ranks(_collectives_during_saves, 2, (str(tmp_path),), timeout=400)
    wrong = [p for rank_problems in problems for p in rank_problems]
    assert not wrong, "; ".join(wrong)
