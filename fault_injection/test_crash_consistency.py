"""Crash consistency: stop a save right after each of its persistence points (CrashMonkey, ALICE).

One rank drives. It saves a previous checkpoint, traces one complete save of the next checkpoint
through the injected file-system layer (fault_injection.faultfs) to number its persistence points
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

import contextlib
import fnmatch
import os
import pickle
import shutil
import signal
import tempfile
import threading
import time
import traceback

import pytest
import torch
import torch.distributed as dist

from fault_injection import faultfs, saves
from fault_injection.faults import PHASES, on_ranks, private_tmpdir
from spec_tests.harness import assert_state_dict_equal, current_target, remove

CHILD_TIMEOUT = 60.0
# One rank has no replica exchange, and "committed" (damage after the save) is not a phase of a running save.
SAVE_PHASES = tuple(p for p in PHASES if p not in ("exchange", "committed"))


# ------------------------------------------------------------------------------------ helpers


def _in_child(tmp: str, name: str, fn, *args, crashes=False):
    """Run fn(*args) in a forked process with its own session and a world-1 process group.

    `crashes`: the process is to be killed on purpose; what is left of its session once it has ended is killed, and
    it gets a TMPDIR of its own in a short directory made here and removed once the child ended (not audited: the
    crash tests judge the checkpoint, FI-TRAINER-1 what a killed trainer leaves).
    Returns ("ok", result), ("raised", traceback text) or ("killed", signal number).
    """
    own = tempfile.mkdtemp(prefix="ckptspec-crash-") if crashes else None
    try:
        return _run_child(tmp, name, own, fn, *args, crashes=crashes)
    finally:
        if own is not None:
            shutil.rmtree(own, ignore_errors=True)


def _run_child(tmp: str, name: str, base: str | None, fn, *args, crashes: bool):
    out = os.path.join(tmp, f"{name}.result")
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.setsid()
            if crashes:
                private_tmpdir(name, base)
            store = dist.FileStore(os.path.join(tmp, f"{name}.store"), 1)
            dist.init_process_group("gloo", store=store, rank=0, world_size=1)
            result = ("ok", fn(*args))
            code = 0
        except BaseException:
            result = ("raised", traceback.format_exc())
        with open(out, "wb") as f:
            pickle.dump(result, f)
        os._exit(code)
    deadline = time.monotonic() + CHILD_TIMEOUT
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise AssertionError(f"{name}: the forked save did not finish within {CHILD_TIMEOUT:g}s")
        time.sleep(0.005)
    remove(os.path.join(tmp, f"{name}.store"))
    if crashes:
        # A crash takes the whole trainer down, as a node's crash does: what the child started (a persistent worker
        # left in its session) ends with it, instead of piling up over the crash points. Whether a worker outlives
        # its trainer is FI-TRAINER-1's subject, not this test's.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)
    if os.WIFSIGNALED(status):
        remove(out)
        return "killed", os.WTERMSIG(status)
    with open(out, "rb") as f:
        result = pickle.load(f)
    remove(out)
    return result


def _leave_a_temporary_file_and_die() -> None:
    tempfile.mkstemp()  # where a crashing trainer's library would put one: its TMPDIR
    os.kill(os.getpid(), signal.SIGKILL)


def test_a_crashed_child_leaves_nothing_in_the_machines_temporary_directory(tmp_path, monkeypatch):
    """Harness: the crash points' children get their TMPDIR in a directory removed after them, not in /tmp."""
    machine_tmp = tmp_path / "machine-tmp"
    machine_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(machine_tmp))
    kind, _ = _in_child(str(tmp_path), "crash0", _leave_a_temporary_file_and_die, crashes=True)
    assert kind == "killed", f"the child should have been killed, but {kind}"
    left = sorted(str(p.relative_to(machine_tmp)) for p in machine_tmp.rglob("*"))
    assert not left, f"a crashed child left {left} in the machine's temporary directory"


def _join_threads(seconds: float) -> None:
    """Let the non-daemon threads a save started finish (an asynchronous cleanup, say), as they would
    in a trainer that keeps running; interpreter exit would wait for them too."""
    deadline = time.monotonic() + seconds
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))


def _run_phases(make_request, log: str | None) -> dict:
    """What the async path does with a request, here, phase by phase; {phase: index of its first point}."""
    marks = {}

    def mark(phase):
        marks[phase] = len(faultfs.read_log(log)) if log else 0

    mark("plan")
    request = make_request()
    mark("staging")
    args = list(request.async_fn_args)
    if request.preload_fn is not None:
        args[1] = request.preload_fn()
    mark("write")
    request.async_fn(*args, **(request.async_fn_kwargs or {}))
    mark("finalize")
    for fn in request.finalize_fns:
        fn()
    _join_threads(CHILD_TIMEOUT / 2)  # what the finalize functions left running belongs to finalize
    return marks


def _phase_of(index: int, marks: dict) -> str:
    """The phase a point belongs to: the last one that had started by then."""
    return [p for p in SAVE_PHASES if marks[p] <= index][-1]


def _point(p: faultfs.Point) -> str:
    return f"point {p.index} ({p.op} {p.path})"


def _commit_index(points, marker: str) -> int | None:
    """The first point that makes `marker` exist: a rename onto it or opening it for writing."""
    for p in points:
        if (p.op == "rename" and p.path.endswith("->" + marker)) or (p.op == "open" and p.path == marker):
            return p.index
    return None


def durability_problems(points, marker: str, data_glob: str) -> list[str]:
    """FI-CRASH-2 on a trace: each data file is fsynced after its last write and before the commit."""
    commit = _commit_index(points, marker)
    if commit is None:
        return [f"the traced save never made {marker} exist"]
    problems = []
    files = sorted({p.path for p in points if p.op == "write" and fnmatch.fnmatch(os.path.basename(p.path), data_glob)})
    for name in files:
        last_write = max(p.index for p in points if p.op == "write" and p.path == name)
        synced = [p.index for p in points if p.op == "fsync" and p.path == name and last_write < p.index < commit]
        if not synced:
            problems.append(
                f"{name}: no fsync between its last write (point {last_write}) and the commit (point {commit})"
            )
    return problems


def _crash_points(tmp: str, save_in_child, phase: str, check) -> tuple:
    """Trace save_in_child, then crash it after each point of `phase` and run check() after each.

    save_in_child(plan) saves in a forked process and returns its phase marks; check() returns
    problems. Returns (number of points in the phase, how many crashes fired, problems).
    """
    trace_log = os.path.join(tmp, "trace.log")
    kind, marks = _in_child(tmp, "trace", save_in_child, trace_log, None)
    assert kind == "ok", f"the traced save failed: {marks}"
    points = [p for p in faultfs.read_log(trace_log) if _phase_of(p.index, marks) == phase]
    if not points:
        pytest.skip(f"the save has no persistence point in its {phase} phase")
    problems, crashed = [], 0
    for point in points:
        log = os.path.join(tmp, f"crash{point.index}.log")
        _in_child(tmp, f"crash{point.index}", save_in_child, log, faultfs.Fault("crash", at=point.index), crashes=True)
        crashed += bool(faultfs.fired(log, "crash"))
        remove(log)
        problems += [f"crash after {_point(point)}: {p}" for p in check()]
    return len(points), crashed, problems


def _report(points, crashed, problems):
    assert crashed == points, f"the crash fired at {crashed} of the {points} traced points"
    assert not problems, f"{len(problems)} problems over {points} crash points:\n" + "\n".join(problems[:20])


# ---------------------------------------------------------------------------------------- DCP


def _dcp_paths(tmp):
    return os.path.join(tmp, "old"), os.path.join(tmp, "new")


def _dcp_save(tmp: str, log: str, fault):
    new = _dcp_paths(tmp)[1]
    remove(new)
    plan = faultfs.Plan(root=new, log=log, faults=(fault,) if fault else ())
    with faultfs.installed(plan):
        return _run_phases(lambda: saves.DcpSave(current_target()).request(new, 1, 0, 1), log)


def _dcp_start(tmp: str):
    """Save checkpoint 0 here (it also starts what a writer keeps between saves), then drop the process group."""
    save = saves.DcpSave(current_target())
    _run_phases(lambda: save.request(_dcp_paths(tmp)[0], 0, 0, 1), None)
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

    return _crash_points(tmp, lambda log, fault: _dcp_save(tmp, log, fault), phase, check)


@pytest.mark.spec("FI-CRASH-1")
@pytest.mark.needs("storage_writer")
@pytest.mark.parametrize("phase", ["plan", "write", "finalize"])
def test_dcp_save_killed_after_any_persistence_point(tmp_path, phase):
    _report(*on_ranks(1, _dcp_crashes, str(tmp_path), phase, timeout=240, backend="gloo")[0])


def _dcp_durability(tmp: str):
    _dcp_start(tmp)
    log = os.path.join(tmp, "trace.log")
    kind, detail = _in_child(tmp, "trace", _dcp_save, tmp, log, None)
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
    from spec_tests.local.common import module

    return module("ckpt_managers.local_manager").LocalCheckpointManager(root)


def _local_state(iteration: int) -> dict:
    """A small state dict (few writes, so few points to crash at)."""
    return {"w": torch.arange(4) + 10 * iteration, "step": iteration}


def _tasd(iteration: int):
    from spec_tests.local.common import tasd

    return tasd(_local_state(iteration))


def _local_save(root: str, base: str, log: str | None, fault):
    """Save iteration 2 (async request, run phase by phase) on a copy of base, which holds iteration 1."""
    remove(root)
    shutil.copytree(base, root)
    plan = faultfs.Plan(root=root, log=log, faults=(fault,) if fault else ()) if log else None
    with faultfs.installed(plan):
        return _run_phases(lambda: _local(root).save(_tasd(2), 2, is_async=True), log)


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


def _restart_and_save(root: str) -> list[str]:
    """A restarted job (FI-CRASH-4): find_latest, then save the iteration after it and find that."""
    manager = _local(root)
    found = manager.find_latest()
    if found not in SAVED:
        return [f"find_latest returned {found}, but only iterations {SAVED} were ever complete"]
    try:
        manager.save(_tasd(found + 1), found + 1, is_async=False)
    except Exception as exc:
        return [f"saving iteration {found + 1} after the restart raised {type(exc).__name__}: {exc}"]
    latest = _local(root).find_latest()
    return [] if latest == found + 1 else [f"after saving iteration {found + 1}, find_latest returned {latest}"]


def _local_crashes(tmp: str, phase: str, restart):
    dist.destroy_process_group()  # forked saves make their own
    root, base = os.path.join(tmp, "local"), os.path.join(tmp, "base")
    kind, detail = _in_child(tmp, "old", lambda: _local(base).save(_tasd(1), 1, is_async=False))
    assert kind == "ok", f"saving iteration 1 failed: {detail}"

    def check():
        kind, detail = _in_child(tmp, "restart", restart, root)
        return detail if kind == "ok" else [f"the restarted job raised:\n{detail}"]

    return _crash_points(tmp, lambda log, fault: _local_save(root, base, log, fault), phase, check)


@pytest.mark.spec("FI-CRASH-3")
@pytest.mark.needs("local_checkpointing")
@pytest.mark.parametrize("phase", ["write", "finalize"])
def test_local_save_killed_after_any_point_never_yields_a_torn_iteration(tmp_path, phase):
    _report(*on_ranks(1, _local_crashes, str(tmp_path), phase, _restart_and_load, timeout=240, backend="gloo")[0])


@pytest.mark.spec("FI-CRASH-4")
@pytest.mark.needs("local_checkpointing")
@pytest.mark.parametrize("phase", ["write", "finalize"])
def test_local_save_killed_after_any_point_can_be_saved_again(tmp_path, phase):
    _report(*on_ranks(1, _local_crashes, str(tmp_path), phase, _restart_and_save, timeout=240, backend="gloo")[0])
