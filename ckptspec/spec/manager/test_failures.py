"""A storage error (MG-FAIL-1) or a kill (MG-CRASH-1) at any persistence point of a manager save leaves resume with
the new checkpoint or the previous one, exactly.

The save judged is that of step 3 after steps 1 and 2 committed, with `keep=2`, so that it crosses every kind of
point a manager has: its data, its metadata, its pointer where it keeps one, and the deletion of step 1. It is
traced once (ckptspec.spec.drivers.faults.faultfs) to number its points, then repeated in a forked process from a copy of the
same starting root once per point: with EIO raised at that point (ENOSPC at each point that creates, writes,
syncs or moves a file), or with the process's whole session SIGKILLed
right after it (ckptspec.spec.drivers.faults.crash_points). After each, a new manager resumes.
"""

from __future__ import annotations

import errno
import os
import shutil

import pytest

from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.drivers.faults.crash_points import crash_points, in_child
from ckptspec.spec.drivers.faults.phases import SAVE_PHASES
from ckptspec.spec.drivers.manager_saves import BOUND, assert_step, managed, resumed, save_steps, step_state
from ckptspec.spec.harness.asserts import attempt

pytestmark = pytest.mark.needs("manager")
KEEP = 2
ALL_POINTS = dict.fromkeys(SAVE_PHASES, 0)  # every point counts as the last phase's: the whole save


def _prepare(tmp: str) -> tuple[str, str]:
    """The starting root (steps 1 and 2 committed), made once, and the root each run works on."""
    start, root = os.path.join(tmp, "start"), os.path.join(tmp, "ckpt")
    kind, result = in_child(tmp, "start", _commit_two, start)
    assert kind == "ok", f"saving steps 1 and 2 failed: {result}"
    return start, root


def _commit_two(start: str) -> None:
    with managed(start, KEEP) as manager:
        save_steps(manager, [1, 2])


def _save_third(start: str, root: str, log: str | None, fault):
    """From a fresh copy of `start`: save step 3 (under the layer when `log` is given); whether it returned."""
    shutil.rmtree(root, ignore_errors=True)
    shutil.copytree(start, root, symlinks=True)
    plan = faultfs.Plan(root=root, log=log, faults=(fault,) if fault else ()) if log else None
    with faultfs.installed(plan), managed(root, KEEP, failed=fault is not None) as manager:
        outcome = attempt(lambda: (manager.save(3, step_state(3)), manager.wait()), bound=BOUND, what="save(3)")
    return outcome.returned


def _resume_problem(tmp: str, root: str, reported: bool | None) -> str | None:
    kind, result = in_child(tmp, "resume", resumed, root)
    assert kind == "ok", f"resume: {result}"
    try:
        if reported or (isinstance(result, tuple) and result[0] == 3):
            assert_step(result, 3, what="resume() after save(3) reported success" if reported else "resume()")
        else:
            assert_step(result, 2, what="resume() after save(3) failed")
    except AssertionError as exc:
        return str(exc).splitlines()[0]
    return None


def _traced_points(tmp: str, start: str, root: str) -> list[faultfs.Point]:
    log = os.path.join(tmp, "trace.log")
    kind, returned = in_child(tmp, "trace", _save_third, start, root, log, None)
    assert kind == "ok", f"the traced save of step 3 failed: {kind} {returned}"
    assert returned, "the traced save of step 3 raised (wait() did not return)"
    points = faultfs.read_log(log)
    if not points:
        pytest.skip("the save of step 3 crossed no persistence point the injected layer can see")
    return points


# The error each point gets: EIO anywhere; ENOSPC where a full disk reports it (creating, writing, syncing, moving).
ERRORS = {"EIO": (errno.EIO, None), "ENOSPC": (errno.ENOSPC, ("open", "write", "fsync", "rename", "mkdir"))}


@pytest.mark.spec("MG-FAIL-1")
@pytest.mark.parametrize("error", ERRORS)
def test_a_storage_error_at_any_point_leaves_the_new_or_the_previous_checkpoint(tmp_path, error):
    tmp, (code, ops) = str(tmp_path), ERRORS[error]
    start, root = _prepare(tmp)
    points, problems, fired = _traced_points(tmp, start, root), [], 0
    points = [p for p in points if ops is None or p.op in ops]
    for point in points:
        log = os.path.join(tmp, f"err{point.index}.log")
        fault = faultfs.Fault("raise", errno=code, at=point.index)
        kind, returned = in_child(tmp, f"err{point.index}", _save_third, start, root, log, fault)
        assert kind == "ok", f"{error} at point {point.index} ({point.op} {point.path}): the trainer {kind}: {returned}"
        fired += bool(faultfs.fired(log, "raise"))
        problem = _resume_problem(tmp, root, returned)
        if problem:
            said = "save(3) reported success" if returned else "save(3) raised"
            problems.append(f"{error} at point {point.index} ({point.op} {point.path}), {said}: {problem}")
    assert fired, f"the error fired at none of the {len(points)} traced points"
    assert not problems, f"{len(problems)} problems over {fired} errors:\n" + "\n".join(problems[:20])


@pytest.mark.spec("MG-CRASH-1")
def test_a_kill_at_any_point_leaves_the_new_or_the_previous_checkpoint(tmp_path):
    tmp = str(tmp_path)
    start, root = _prepare(tmp)

    def save(log, fault):
        _save_third(start, root, log, fault)
        return ALL_POINTS

    def check():
        problem = _resume_problem(tmp, root, None)
        return [problem] if problem else []

    points, crashed, problems = crash_points(tmp, save, SAVE_PHASES[-1], check)
    assert crashed, f"the crash fired at none of the {points} traced points"
    assert not problems, f"{len(problems)} problems over {crashed} crashes:\n" + "\n".join(problems[:20])
