"""One storage error per save, on a warm persistent queue: what the save that hit it and the save after it did.

`storage_errors(tmp, phase)` runs on every rank: a save to a previous checkpoint, then for each errno of
ckptspec.faults.faults.ERRNOS a save whose `phase` meets that error (where faults.STORAGE_FAULTS puts it) and the
next save on the same queue. Used by test_storage_faults.py (gloo) and test_gpu_faults.py (NCCL).
"""

import os
from dataclasses import dataclass

from ckptspec.faults import saves
from ckptspec.faults.faults import ERRNOS, STORAGE_FAULTS
from ckptspec.spec.drivers.bounds import BOUND, EXIT_BOUND
from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.drivers.faults.phases import Hooks, Step
from ckptspec.spec.harness import HUNG, async_core, close_quietly, current_target, outcome_of, world

__all__ = ["WORLD", "ErrnoSaves", "storage_errors"]

WORLD = 2


def _hooks(tmp, phase, errno_name, rank, new):
    ranks, where = STORAGE_FAULTS[phase, errno_name]
    if ranks != "all" and ranks != rank:
        return Hooks(), None
    log = os.path.join(tmp, f"fs-{errno_name}-{rank}.log")
    fault = faultfs.Fault("raise", errno=faultfs.errno_of(errno_name), **where)
    return Hooks.at(phase, Step(fs=faultfs.Plan(root=new, log=log, faults=(fault,)))), log


@dataclass(frozen=True)
class ErrnoSaves:
    outcome: str  # of the save that hit the error
    fired: bool  # whether the fault layer injected the error on this rank
    after: str  # outcome of the next save on the same queue, or "not tried"


def storage_errors(tmp, phase) -> dict[str, ErrnoSaves]:
    """Per errno: the faulty save's outcome, whether the fault fired, and the next save's outcome."""
    rank, world_size = world()
    save = saves.DcpSave(current_target())
    queue = async_core().AsyncCallsQueue(persistent=True)
    save.save(queue, os.path.join(tmp, "old"), 0, rank, world_size)
    results: dict[str, ErrnoSaves] = {}
    for version, errno_name in enumerate(ERRNOS, start=1):
        new = os.path.join(tmp, f"new-{errno_name}")
        hooks, log = _hooks(tmp, phase, errno_name, rank, new)
        outcome = outcome_of(
            save.save,
            queue,
            new,
            version,
            rank,
            world_size,
            hooks,
            bound=BOUND,
            what=f"a save hitting {errno_name} in {phase}",
        )
        fired = log is not None and bool(faultfs.fired(log, "raise"))
        if outcome == HUNG:
            results[errno_name] = ErrnoSaves(outcome, fired, "not tried")
            break
        after = outcome_of(
            save.save,
            queue,
            os.path.join(tmp, f"after-{errno_name}"),
            10 + version,
            rank,
            world_size,
            bound=BOUND,
            what=f"the save after {errno_name}",
        )
        results[errno_name] = ErrnoSaves(outcome, fired, after)
        if after == HUNG:
            break
    else:
        close_quietly(queue, abort=True, bound=EXIT_BOUND)  # abort: the quick way
    return results
