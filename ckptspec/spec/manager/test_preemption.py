"""SIGTERM during a manager save leaves the previous checkpoint the one resumed, exactly (MG-TERM-1).

Step 1 is committed; then, in a forked trainer (ckptspec.spec.drivers.faults.preemption), the save of step 2 is held at a point
before it can commit: its first write below the checkpoint root (`data`), or the last rename a successful save of
step 2 makes, found on a traced copy (`commit`: the call is held before it runs). The trainer is sent SIGTERM there;
once it ended (or was SIGKILLed after the bound) its whole session is killed and reaped, and a new manager resumes.
"""

from __future__ import annotations

import os
import shutil

import pytest

from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.drivers.faults.crash_points import in_child
from ckptspec.spec.drivers.faults.preemption import terminated
from ckptspec.spec.drivers.manager_saves import assert_step, managed, resumed, save_steps

pytestmark = pytest.mark.needs("manager")


def _commit_one(root: str) -> None:
    with managed(root) as manager:
        save_steps(manager, [1])


def _renames(root: str) -> int:
    """How many renames a successful save of step 2 makes over `root` (step 1 committed)."""
    log = root + ".trace"
    with faultfs.installed(faultfs.Plan(root=root, log=log)), managed(root) as manager:
        save_steps(manager, [2])
    return sum(p.op == "rename" for p in faultfs.read_log(log))


def _held_save(root: str, log: str, fault: faultfs.Fault) -> None:
    """Save step 2 with `fault` (a hang) installed; the parent sends SIGTERM while it holds."""
    manager = managed(root).__enter__()  # never closed: the process is terminated inside the save
    with faultfs.installed(faultfs.Plan(root=root, log=log, faults=(fault,))):
        save_steps(manager, [2])


def _fault(tmp: str, root: str, where: str) -> faultfs.Fault:
    if where == "data":
        return faultfs.Fault("hang", op="write", nth=1)
    copy = os.path.join(tmp, "traced")
    shutil.copytree(root, copy, symlinks=True)
    kind, renames = in_child(tmp, "trace", _renames, copy)
    assert kind == "ok", f"the traced save of step 2 failed: {renames}"
    if not renames:
        pytest.skip("a save of step 2 makes no rename below the root: its commit cannot be held")
    return faultfs.Fault("hang", op="rename", nth=renames)


@pytest.mark.spec("MG-TERM-1")
@pytest.mark.parametrize("where", ["data", "commit"])
def test_sigterm_during_a_save_leaves_the_previous_checkpoint(tmp_path, where):
    tmp, root = str(tmp_path), str(tmp_path / "ckpt")
    kind, result = in_child(tmp, "committed", _commit_one, root)
    assert kind == "ok", f"saving step 1 failed: {result}"
    fault, log = _fault(tmp, root, where), os.path.join(tmp, "held.log")
    outcome = terminated(tmp, "held", _held_save, root, log, fault, log=log)
    if not outcome.reached:
        pytest.skip(f"the save of step 2 never reached its {where} point ({outcome.ended_by}): nothing to interrupt")
    kind, result = in_child(tmp, "resume", resumed, root)
    assert kind == "ok", f"resume: {result}"
    assert_step(
        result, 1, what=f"resume() after SIGTERM held the save of step 2 at its {where} (ended by {outcome.ended_by})"
    )
