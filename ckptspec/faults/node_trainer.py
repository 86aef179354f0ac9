"""The trainer of the lost-node test (ckptspec/faults/test_node_faults.py), run by torchrun on each "node":

    python -m torch.distributed.run ... -m ckptspec.faults.node_trainer TMP PHASE

First attempt (TMP holds no outcome yet): every rank saves checkpoint `old` in full, then saves `new` with rank 1's
save held in PHASE (it writes its pid to TMP/in-phase, then waits for a gate that never opens) until the test kills
rank 1's whole node. Rank 0 records what its save did (within BOUND) in TMP/outcome.json and the pids of the
processes it started in TMP/processes0.json, then exits 1, as a trainer whose save failed does, which ends the job.
When the job runs again (TMP/outcome.json exists): every rank checks that `old` loads exactly and that `new`, if
committed, loads exactly, and records it in TMP/recovered<rank>.json.
"""

from __future__ import annotations

import json
import os
import sys

import psutil
import torch.distributed as dist

from ckptspec.faults import saves
from ckptspec.spec.drivers.bounds import BOUND, EXIT_BOUND
from ckptspec.spec.drivers.faults import tmpdirs
from ckptspec.spec.drivers.faults.phases import Hooks, Step
from ckptspec.spec.harness import async_core, attempt, close_quietly, current_target, outcome_of

VICTIM = 1


def _paths(tmp: str) -> tuple[str, str]:
    return os.path.join(tmp, "old"), os.path.join(tmp, "new")


def _write(path: str, record: dict | list) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def _first_attempt(tmp: str, phase: str, rank: int, world_size: int) -> None:
    save, queue = saves.for_target(current_target()), async_core().AsyncCallsQueue(persistent=True)
    old, new = _paths(tmp)
    save.save(queue, old, 0, rank, world_size)
    dist.barrier()
    hooks = Hooks()
    if rank == VICTIM:
        hooks = Hooks.at(phase, Step(marker=os.path.join(tmp, "in-phase"), gate=os.path.join(tmp, "never")))
    what = f"a save during which the node of rank {VICTIM} is lost ({phase})"
    outcome = outcome_of(save.save, queue, new, 1, rank, world_size, hooks, bound=BOUND, what=what)
    if rank == 0:
        _write(os.path.join(tmp, "outcome.json"), {"outcome": outcome})
        # What this trainer started (its worker, the worker's writers): none may outlive it (FI-ORPHAN-1).
        _write(os.path.join(tmp, "processes0.json"), [p.pid for p in psutil.Process().children(recursive=True)])
    close_quietly(queue, abort=True, bound=EXIT_BOUND)
    sys.stdout.flush()
    os._exit(1)  # a failed save ends the trainer; a call left running (HUNG) must not keep it alive


def _check(fn, *args) -> str:
    return attempt(fn, *args, bound=BOUND).text


def _after_restart(tmp: str, rank: int, world_size: int) -> None:
    save = saves.for_target(current_target())
    old, new = _paths(tmp)
    record = {
        "old": _check(save.assert_loads, old, 0, world_size),
        "new_committed": save.committed(new),
    }
    if record["new_committed"]:
        record["new"] = _check(save.assert_loads, new, 1, world_size)
    _write(os.path.join(tmp, f"recovered{rank}.json"), record)
    dist.barrier()


def main(tmp: str, phase: str) -> None:
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    if os.environ.get("CKPTSPEC_FI_TMPDIR"):  # the orphan audit's TMPDIR of the test (ckptspec/faults/audit.py)
        tmpdirs.private_tmpdir(f"node-rank{rank}")
    first = [not os.path.exists(os.path.join(tmp, "outcome.json"))]
    dist.broadcast_object_list(first, src=0)  # rank 0 decides, for every rank
    if first[0]:
        _first_attempt(tmp, phase, rank, world_size)
    else:
        _after_restart(tmp, rank, world_size)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(*sys.argv[1:3])
