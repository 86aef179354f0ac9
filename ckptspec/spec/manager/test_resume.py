"""Resume finds the newest committed checkpoint and never an uncommitted one (MG-RESUME-1); retention keeps the k
newest (MG-KEEP-1), no more (MG-KEEP-2), and deletes nothing before a newer save committed (MG-RETAIN-1, weak level
MG-RETAIN-1w); a damaged newest checkpoint is refused, with a fallback to an older one (MG-CORRUPT-1, weak level
MG-CORRUPT-1w).

Each scenario runs in a forked process with a world of one rank (ckptspec.spec.drivers.faults.crash_points.in_child), and what a
restarted job would load is read by a new manager over the same root. A save is made to fail by the injected
file-system layer (ckptspec.spec.drivers.faults.faultfs), in any thread or forked process of the trainer: at every open for
writing, write and rename below the failing step's location (its data), or at the last rename a successful save of
it makes (its commit: DCP's `.metadata`, a pointer), found on a traced copy; where it never fired, or the save
reported success anyway, the test skips saying so. Where the manager's retention races with the failing save's
writer creating the new checkpoint's location (manager.retention_order), each order is forced: the save in flight
visible to retention ("location-first", the tests kept from before) and not yet ("retention-first"), so no verdict
depends on which side a run's scheduling favoured.
"""

from __future__ import annotations

import errno
import os
import shutil

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.drivers.faults.crash_points import in_child
from ckptspec.spec.drivers.manager_saves import (
    BOUND,
    assert_step,
    expected,
    files_below,
    loaded,
    managed,
    resumed,
    save_steps,
    step_state,
)
from ckptspec.spec.harness.asserts import assert_state_dict_equal, attempt

pytestmark = pytest.mark.needs("manager")
REFUSED = "refused"  # what a child returns when the manager refuses the retention setting (ValueError)


def _child(tmp: str, name: str, fn, *args):
    kind, result = in_child(tmp, name, fn, *args)
    assert kind == "ok", f"{name}: {kind}: {result}"
    return result


def _saves(root: str, steps: list[int], keep: int = 0):
    try:
        with managed(root, keep) as manager:
            save_steps(manager, steps)
        return manager.steps()  # after close(): retention may act in the background until then
    except ValueError as exc:
        if not steps or ("keep" not in str(exc).lower() and "replica" not in str(exc).lower()):
            raise
        return REFUSED


def _after_saves(root: str, steps: list[int], keep: int):
    """Save `steps`; then what a new manager sees: the steps on storage, resume's result, each retained load."""
    on_storage = _saves(root, steps, keep)
    if on_storage == REFUSED:
        return REFUSED
    retained = steps[-keep:] if keep else steps
    return on_storage, resumed(root, keep=keep), {step: loaded(root, step, keep=keep) for step in retained}


@pytest.mark.spec("MG-RESUME-1")
@given(steps=st.lists(st.integers(1, 10**6), min_size=1, max_size=4, unique=True).map(sorted))
def test_resume_loads_the_newest_committed_checkpoint(tmp_path_factory, steps):
    tmp = str(tmp_path_factory.mktemp("resume"))
    _, result, _ = _child(tmp, "saves", _after_saves, os.path.join(tmp, "ckpt"), steps, 0)
    assert_step(result, steps[-1], what=f"resume() after the committed saves of steps {steps}")


def _retention(tmp_path_factory, count: int, keep: int):
    tmp = str(tmp_path_factory.mktemp("keep"))
    steps = list(range(1, count + 1))
    result = _child(tmp, "saves", _after_saves, os.path.join(tmp, "ckpt"), steps, keep)
    assume(result != REFUSED)  # a retention setting the library refuses (torchtitan: keep_latest_k=1)
    on_storage, _, loads = result
    return steps, steps[-keep:] if keep else steps, on_storage, loads


@pytest.mark.spec("MG-KEEP-1")
@pytest.mark.needs("manager_retention")
@given(count=st.integers(1, 5), keep=st.integers(0, 3))
def test_retention_keeps_the_k_newest_committed_checkpoints(tmp_path_factory, count, keep):
    steps, retained, on_storage, loads = _retention(tmp_path_factory, count, keep)
    assert set(retained) <= set(on_storage), (
        f"after the committed saves of steps {steps} with keep={keep}, the checkpoints on storage are those of steps "
        f"{on_storage}; steps {sorted(set(retained) - set(on_storage))} should have been kept"
    )
    for step, state in loads.items():
        assert not isinstance(state, str), f"load({step}) of a retained checkpoint raised {state}"
        assert_state_dict_equal(state, expected(step), call=f"load({step}), keep={keep}, saves {steps}")


@pytest.mark.spec("MG-KEEP-2")
@pytest.mark.needs("manager_retention")
@given(count=st.integers(1, 5), keep=st.integers(1, 3))
def test_retention_keeps_no_more_than_k_checkpoints(tmp_path_factory, count, keep):
    steps, _, on_storage, _ = _retention(tmp_path_factory, count, keep)
    assert len(on_storage) <= keep, (
        f"after the committed saves of steps {steps} with keep={keep} and close(), the checkpoints of steps "
        f"{on_storage} are on storage: {len(on_storage) - keep} more than asked"
    )


def _save_killed(root: str, step: int):
    """Save `step`, the process killing itself at the save's first fsync or rename, whichever comes first: before
    anything of it can be committed (a manager that never fsyncs commits by a rename)."""
    faults = (faultfs.Fault("die", op="fsync"), faultfs.Fault("die", op="rename"))
    plan = faultfs.Plan(root=root, log=os.path.join(root + ".log"), faults=faults)
    with faultfs.installed(plan), managed(root) as manager:
        manager.save(step, step_state(step))
        manager.wait()


@pytest.mark.spec("MG-RESUME-1")
def test_a_save_killed_before_it_committed_is_never_resumed(tmp_path):
    tmp, root = str(tmp_path), str(tmp_path / "ckpt")
    _child(tmp, "committed", _saves, root, [1])
    kind, _ = in_child(tmp, "killed", _save_killed, root, 2, crashes=True)
    if kind != "killed" or not faultfs.fired(root + ".log", "die"):
        pytest.skip("the injected layer saw no fsync or rename below the root: the save could not be killed in it")
    assert_step(_child(tmp, "resume", resumed, root), 1, what="resume() after the save of step 2 was killed")


def _renames(root: str, keep: int) -> int:
    """How many renames a successful save of step 3 makes, traced on a copy of `root`: the last is its commit. Counted
    by kind, not by index, since the new manager of the copy may cross points the live one skips (a directory it
    makes again)."""
    copy, log = root + ".copy", root + ".trace"
    shutil.copytree(root, copy, symlinks=True)
    with faultfs.installed(faultfs.Plan(root=copy, log=log)), managed(copy, keep) as manager:
        save_steps(manager, [3])
    return sum(p.op == "rename" for p in faultfs.read_log(log))


def _failed_after(root: str, keep: int, where: str, order: str):
    """Commit steps 1 and 2, then save step 3 with the same manager (as one job does), failing with EIO: at every
    open for writing, write and rename below its location (`where` = "data"; a file moved in whole falls back to a
    copy when its rename fails), or at the last rename of its save, its commit (`where` = "commit"); retention in
    `order` where it races with the writer (the last value returned: whether it was forced)."""
    log = root + ".log"
    try:
        manager_of = managed(root, keep, failed=True)
        manager = manager_of.__enter__()
    except ValueError:
        return REFUSED
    try:
        forced = manager.retention_order(order)
        save_steps(manager, [1, 2])
        if where == "data":
            plan = faultfs.Plan(
                root=manager.location(3),
                log=log,
                faults=tuple(faultfs.Fault("raise", errno=errno.EIO, op=op) for op in ("open", "write", "rename")),
            )
        else:
            renames = _renames(root, keep)
            faults = (faultfs.Fault("raise", errno=errno.EIO, op="rename", nth=renames),) if renames else ()
            plan = faultfs.Plan(root=root, log=log, faults=faults)
        with faultfs.installed(plan):
            outcome = attempt(lambda: (manager.save(3, step_state(3)), manager.wait()), bound=BOUND, what="save(3)")
    finally:
        manager_of.__exit__(None, None, None)
    fired = bool(faultfs.fired(log, "raise"))
    retained = [1, 2][-keep:]
    return outcome.returned, fired, {step: loaded(root, step, keep=keep) for step in retained}, forced


def _retained_after_a_failed_save(tmp: str, keep: int, where: str, order: str = "location-first"):
    result = _child(tmp, "failed", _failed_after, os.path.join(tmp, "ckpt"), keep, where, order)
    if result == REFUSED:
        pytest.skip(f"the manager refuses keep={keep}")
    returned, fired, loads, forced = result
    if order != "location-first" and not forced:
        pytest.skip(
            "not applicable: the manager lacks retention_order (its retention never races with its writer), so the "
            "save in flight is judged in one order, by test_nothing_is_deleted_for_a_save_that_failed"
        )
    if not fired:
        pytest.skip(f"the injected layer saw no {where} point of the save of step 3: no save failed")
    if returned:
        pytest.skip(f"the save of step 3 reported success although its {where} failed (judged by MG-FAIL-1)")
    return loads


@pytest.mark.spec("MG-RETAIN-1")
@pytest.mark.needs("manager_retention")
@pytest.mark.parametrize("where", ["data", "commit"])
@pytest.mark.parametrize("keep", [1, 2])
def test_nothing_is_deleted_for_a_save_that_failed(tmp_path, keep, where):
    loads = _retained_after_a_failed_save(str(tmp_path), keep, where)
    lost = {step: state for step, state in loads.items() if isinstance(state, str)}
    assert not lost, (
        f"keep={keep}: the save of step 3 failed at its {where}, but the checkpoints it would have superseded no longer load: {lost}"
    )
    for step, state in loads.items():
        assert_state_dict_equal(state, expected(step), call=f"load({step}) after the failed save of step 3")


@pytest.mark.spec("MG-RETAIN-1")
@pytest.mark.needs("manager_retention")
@pytest.mark.parametrize("where", ["data", "commit"])
def test_nothing_is_deleted_for_a_save_that_failed_when_retention_ran_first(tmp_path, where):
    """As test_nothing_is_deleted_for_a_save_that_failed with keep=2, retention listing the checkpoints before the
    save's writer created its location, where the two race."""
    loads = _retained_after_a_failed_save(str(tmp_path), 2, where, order="retention-first")
    lost = {step: state for step, state in loads.items() if isinstance(state, str)}
    assert not lost, (
        f"keep=2, retention first: the save of step 3 failed at its {where}, but the checkpoints it would have "
        f"superseded no longer load: {lost}"
    )
    for step, state in loads.items():
        assert_state_dict_equal(state, expected(step), call=f"load({step}) after the failed save of step 3")


@pytest.mark.spec("MG-RETAIN-1w")
@pytest.mark.parametrize("where", ["data", "commit"])
@pytest.mark.parametrize("keep", [1, 2])
def test_the_newest_committed_checkpoint_survives_a_save_that_failed(tmp_path, keep, where):
    state = _retained_after_a_failed_save(str(tmp_path), keep, where)[2]
    assert not isinstance(state, str), (
        f"keep={keep}: the save of step 3 failed at its {where}, and step 2, the newest committed checkpoint, no longer loads: {state}"
    )
    assert_state_dict_equal(state, expected(2), call="load(2) after the failed save of step 3")


def _damaged(root: str):
    """Commit steps 1 and 2, truncate every file of every copy of step 2 to half its size, and resume."""
    with managed(root) as manager:
        save_steps(manager, [1, 2])
    for path in (f for where in manager.copies(2) for f in files_below(where)):
        os.truncate(path, os.path.getsize(path) // 2)
    return resumed(root)


@pytest.mark.spec("MG-CORRUPT-1")
@pytest.mark.needs("manager_retention")
def test_a_damaged_newest_checkpoint_falls_back_to_the_older_one(tmp_path):
    result = _child(str(tmp_path), "damaged", _damaged, str(tmp_path / "ckpt"))
    assert_step(result, 1, what="resume() with step 2's files truncated")


@pytest.mark.spec("MG-CORRUPT-1w")
def test_a_damaged_newest_checkpoint_is_never_loaded(tmp_path):
    result = _child(str(tmp_path), "damaged", _damaged, str(tmp_path / "ckpt"))
    if isinstance(result, str):
        return  # refused loudly
    assert_step(result, 1, what="resume() with step 2's files truncated (it must raise or load step 1)")
