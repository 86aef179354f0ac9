"""Crash consistency: stop a save right after each of its persistence points (CrashMonkey, ALICE).

One rank drives. It saves a previous checkpoint, traces one complete save of the next checkpoint
through the injected file-system layer (ckptspec.spec.drivers.faults.faultfs) to number its persistence points
and tell which phase each belongs to, then for every point k of the phase under test runs the same
save again in a forked process, in its own session, whose whole session is SIGKILLed right after
point k (writer processes included). After each crash the checkpoints are read back the way a
restarted job would:

- DCP: the previous checkpoint loads exactly, and the new one is either not committed (no
  `.metadata`) or loads exactly;
- local checkpointing: find_latest returns the previous or the new iteration and load returns
  exactly that iteration's state dict (FI-CRASH-3); the job can save its next iteration (FI-CRASH-4).

The saves run synchronously in the forked process, phase after phase as the async path runs them
(plan: building the request; staging: preload_fn; write: async_fn; finalize: the finalize
functions): the files a save changes do not depend on which process changes them. A process crash
keeps what was written to the page cache; what a power loss would lose is checked on the trace
instead (FI-CRASH-2: data fsynced before the commit marker).
"""

import os
import shutil
import signal
import tempfile

import pytest
import torch
import torch.distributed as dist

from ckptspec.faults import saves
from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.drivers.faults.crash_points import (
    crash_points,
    durability_problems,
    in_child,
    report_crashes,
    run_phases,
)
from ckptspec.spec.drivers.faults.tmpdirs import on_ranks
from ckptspec.spec.harness import assert_state_dict_equal, current_target, remove
from ckptspec.spec.harness.shared_runs import shared


def _leave_a_temporary_file_and_die() -> None:
    tempfile.mkstemp()  # where a crashing trainer's library would put one: its TMPDIR
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_crashed_child_leaves_nothing_in_the_machines_temporary_directory(tmp_path, monkeypatch):
    """Harness: the crash points' children get their TMPDIR in a directory removed after them, not in /tmp."""
    machine_tmp = tmp_path / "machine-tmp"
    machine_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(machine_tmp))
    kind, _ = in_child(str(tmp_path), "crash0", _leave_a_temporary_file_and_die, crashes=True)
    assert kind == "killed", f"the child should have been killed, but {kind}"
    left = sorted(str(p.relative_to(machine_tmp)) for p in machine_tmp.rglob("*"))
    assert not left, f"a crashed child left {left} in the machine's temporary directory"


# ---------------------------------------------------------------------------------------- DCP


def _dcp_paths(tmp):
    return os.path.join(tmp, "old"), os.path.join(tmp, "new")


def _dcp_save(tmp: str, log: str, fault):
    new = _dcp_paths(tmp)[1]
    remove(new)
    plan = faultfs.Plan(root=new, log=log, faults=(fault,) if fault else ())
    with faultfs.installed(plan):
        return run_phases(lambda: saves.DcpSave(current_target()).request(new, 1, 0, 1), log)


def _dcp_start(tmp: str):
    """Save checkpoint 0 here (it also starts what a writer keeps between saves), then drop the process group."""
    save = saves.DcpSave(current_target())
    run_phases(lambda: save.request(_dcp_paths(tmp)[0], 0, 0, 1), None)
    dist.destroy_process_group()  # forked saves make their own
    return save


def _dcp_crashes(tmp: str, phase: str):
    save = _dcp_start(tmp)
    old, new = _dcp_paths(tmp)

    def check():
        problems = []
        for what, load in (
            ("previous", lambda: save.assert_loads(old, 0, 1)),
            ("new", lambda: save.committed(new) and save.assert_loads(new, 1, 1)),
        ):
            try:
                load()
            except Exception as exc:
                problems.append(f"the {what} checkpoint: {type(exc).__name__}: {exc}")
        return problems

    return crash_points(tmp, lambda log, fault: _dcp_save(tmp, log, fault), phase, check)


@pytest.mark.spec("FI-CRASH-1")
@pytest.mark.needs("storage_writer")
@pytest.mark.parametrize("phase", ["plan", "write", "finalize"])
def test_dcp_save_killed_after_any_persistence_point(tmp_path, phase):
    report_crashes(*on_ranks(1, _dcp_crashes, str(tmp_path), phase, timeout=240, backend="gloo")[0])


def _dcp_durability(tmp: str):
    _dcp_start(tmp)
    log = os.path.join(tmp, "trace.log")
    kind, detail = in_child(tmp, "trace", _dcp_save, tmp, log, None)
    assert kind == "ok", f"the traced save failed: {detail}"
    return durability_problems(faultfs.read_log(log), ".metadata", "*.distcp")


@pytest.mark.spec("FI-CRASH-2")
@pytest.mark.needs("storage_writer")
@pytest.mark.parametrize("phase", ["finalize"])
def test_dcp_data_is_fsynced_before_the_metadata_appears(tmp_path, phase):
    (problems,) = on_ranks(1, _dcp_durability, str(tmp_path), timeout=120, backend="gloo")
    assert not problems, "\n".join(problems)


# ---------------------------------------------------------------------------------------- local

SAVED = (1, 2)  # the iterations whose save completed at some point (2 only in the traced save)


def _local(root: str):
    from ckptspec.spec.drivers.local import module

    return module("ckpt_managers.local_manager").LocalCheckpointManager(root)


def _local_state(iteration: int) -> dict:
    """A small state dict (few writes, so few points to crash at)."""
    return {"w": torch.arange(4) + 10 * iteration, "step": iteration}


def _tasd(iteration: int):
    from ckptspec.spec.drivers.local import tasd

    return tasd(_local_state(iteration))


def _local_save(root: str, base: str, log: str | None, fault):
    """Save iteration 2 (async request, run phase by phase) on a copy of base, which holds iteration 1."""
    remove(root)
    shutil.copytree(base, root)
    plan = faultfs.Plan(root=root, log=log, faults=(fault,) if fault else ()) if log else None
    with faultfs.installed(plan):
        return run_phases(lambda: _local(root).save(_tasd(2), 2, is_async=True), log)


def _restart_and_load(root: str) -> list[str]:
    """A restarted job (FI-CRASH-3): find_latest, then load what it found."""
    manager = _local(root)
    found = manager.find_latest()
    if found not in SAVED:
        return [f"find_latest returned {found}, but only iterations {SAVED} were ever complete"]
    loaded, _ = manager.load()
    try:
        assert_state_dict_equal(loaded.state_dict, _local_state(found), call=f"load() of iteration {found}")
    except AssertionError as exc:
        return [str(exc)]
    return []


# Which clause a problem of the shared run counts against: FI-CRASH-4 alone, its weak level alone, or both.
STRICT, WEAK, BOTH = "[FI-CRASH-4] ", "[FI-CRASH-4w] ", "[both] "


def _restart_and_save(root: str) -> list[str]:
    """A restarted job (FI-CRASH-4, FI-CRASH-4w): find_latest, save the iteration after it and find that, then
    save the one after that and find it. Each problem is marked with the level it counts against."""
    manager = _local(root)
    found = manager.find_latest()
    if found not in SAVED:
        return [f"{BOTH}find_latest returned {found}, but only iterations {SAVED} were ever complete"]
    problems = []
    for iteration, mark in ((found + 1, STRICT), (found + 2, WEAK)):
        try:
            _local(root).save(_tasd(iteration), iteration, is_async=False)
        except Exception as exc:
            problems.append(f"{mark}saving iteration {iteration} after the restart raised {type(exc).__name__}: {exc}")
            continue
        latest = _local(root).find_latest()
        if latest != iteration:
            problems.append(f"{mark}after saving iteration {iteration}, find_latest returned {latest}")
    return problems


def _local_crashes(tmp: str, phase: str, restart):
    dist.destroy_process_group()  # forked saves make their own
    root, base = os.path.join(tmp, "local"), os.path.join(tmp, "base")
    kind, detail = in_child(tmp, "old", lambda: _local(base).save(_tasd(1), 1, is_async=False))
    assert kind == "ok", f"saving iteration 1 failed: {detail}"

    def check():
        kind, detail = in_child(tmp, "restart", restart, root)
        return detail if kind == "ok" else [f"the restarted job raised:\n{detail}"]

    return crash_points(tmp, lambda log, fault: _local_save(root, base, log, fault), phase, check)


@pytest.mark.spec("FI-CRASH-3")
@pytest.mark.needs("local_checkpointing")
@pytest.mark.parametrize("phase", ["write", "finalize"])
def test_local_save_killed_after_any_point_never_yields_a_torn_iteration(tmp_path, phase):
    report_crashes(
        *on_ranks(1, _local_crashes, str(tmp_path), phase, _restart_and_load, timeout=240, backend="gloo")[0]
    )


def _saved_again(tmp_path_factory, phase: str) -> tuple:
    """crash_points' result for the restart of `_restart_and_save`, made once per session for FI-CRASH-4 and its
    weak level."""

    def make():
        tmp = str(tmp_path_factory.mktemp(f"saved-again-{phase}"))
        return on_ranks(1, _local_crashes, tmp, phase, _restart_and_save, timeout=240, backend="gloo")[0]

    return shared(tmp_path_factory, f"saved-again-{phase}", make)


def _counting_against(problems: list[str], level: str) -> list[str]:
    """The problems of the shared run that count against `level` (STRICT or WEAK), their marks removed; a problem
    marked with neither (a restarted job that raised) counts against both."""
    other = WEAK if level == STRICT else STRICT
    return [p.replace(level, "").replace(BOTH, "") for p in problems if other not in p]


@pytest.mark.spec("FI-CRASH-4")
@pytest.mark.needs("local_checkpointing")
@pytest.mark.parametrize("phase", ["write", "finalize"])
def test_local_save_killed_after_any_point_can_be_saved_again(tmp_path_factory, phase):
    points, crashed, problems = _saved_again(tmp_path_factory, phase)
    report_crashes(points, crashed, _counting_against(problems, STRICT))


@pytest.mark.spec("FI-CRASH-4w")
@pytest.mark.needs("local_checkpointing")
@pytest.mark.parametrize("phase", ["write", "finalize"])
def test_local_save_killed_after_any_point_leaves_later_iterations_saveable(tmp_path_factory, phase):
    points, crashed, problems = _saved_again(tmp_path_factory, phase)
    report_crashes(points, crashed, _counting_against(problems, WEAK))
