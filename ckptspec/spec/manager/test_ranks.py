"""Two ranks agree on the step they resume (MG-RESUME-2).

Two ranks (the rank pool) commit steps 1 and 2 below one root, each saving its own keys; then each rank's new
manager resumes with its own keys as the template. `lost`: before resuming, rank 1 deletes what its manager calls
the location of step 2 (its part of it, where each rank keeps its own). Every call is bounded (the drivers'
bounds); a rank that exceeds one reports it. A manager adapter that drives one process's job, not one job over
every rank (Lightning's: a one-device Trainer per process, each writing the same file names), lacks capability
`manager_ranks`.
"""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from ckptspec.spec.drivers.manager_saves import managed, save_steps, step_state
from ckptspec.spec.harness.asserts import assert_state_dict_equal, attempt
from ckptspec.spec.harness.processes import remove
from ckptspec.spec.harness.ranks import world

pytestmark = pytest.mark.needs("manager", "manager_ranks")
BOUND = 60.0


def _resume_on_each_rank(root: str, lose: bool):
    rank, _ = world()
    with managed(root) as manager:
        save_steps(manager, [1, 2])
        where = manager.location(2)
    if lose and rank == 1:
        remove(where)
    dist.barrier()  # no rank resumes before the loss
    outcome = attempt(lambda: _resume(root, rank), bound=BOUND, what="resume()")
    return outcome.value if outcome.returned else outcome.text


def _resume(root: str, rank: int):
    with managed(root, failed=True) as manager:  # a refused resume may make close() raise again
        return manager.resume(step_state(0, rank))


@pytest.mark.spec("MG-RESUME-2")
@pytest.mark.parametrize("lost", [False, True], ids=["intact", "lost"])
def test_every_rank_resumes_the_same_step(rank_pool, tmp_path, lost):
    results = rank_pool(2).run(_resume_on_each_rank, os.path.join(str(tmp_path), "ckpt"), lost)
    steps = [r[0] if isinstance(r, tuple) else r for r in results]
    if not lost:
        assert steps == [2, 2], f"with steps 1 and 2 committed, the ranks resumed {steps}"
    elif all(isinstance(r, str) for r in results):
        return  # refused on every rank, loudly
    mixed = len(set(map(str, steps))) > 1 or any(isinstance(r, str) for r in results)
    assert not mixed, f"after rank 1 lost its files of step 2, the ranks resumed {steps}"
    for rank, result in enumerate(results):
        if result is not None:
            assert_state_dict_equal(result[1], step_state(result[0], rank), call=f"rank {rank}: resume()")
