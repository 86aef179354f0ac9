"""Crash points of one save: trace its persistence points, then crash a forked copy of it after each one.

`run_phases` runs a request phase by phase as the async path does (plan, staging, write, finalize) and numbers the
first point of each; `crash_points` runs the save in a child once per traced point of a phase, SIGKILLing the
child's whole session right after that point, and collects what `check` finds wrong after each crash;
`durability_problems` reads a trace for data not fsynced before the commit marker. Used by
ckptspec/faults/test_crash_consistency.py and ckptspec/spec/protocol/test_durability.py.
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
from collections.abc import Callable
from typing import Any

import pytest
import torch.distributed as dist

from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.drivers.faults.phases import SAVE_PHASES
from ckptspec.spec.drivers.faults.tmpdirs import private_tmpdir
from ckptspec.spec.harness import remove

__all__ = [
    "CHILD_TIMEOUT",
    "crash_points",
    "durability_problems",
    "in_child",
    "report_crashes",
    "run_phases",
]

CHILD_TIMEOUT = 60.0


def in_child(tmp: str, name: str, fn: Callable[..., Any], *args: Any, crashes: bool = False) -> tuple[str, Any]:
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


def _run_child(
    tmp: str, name: str, base: str | None, fn: Callable[..., Any], *args: Any, crashes: bool
) -> tuple[str, Any]:
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
        reply: tuple[str, Any] = pickle.load(f)
    remove(out)
    return reply


def _join_threads(seconds: float) -> None:
    """Let the non-daemon threads a save started finish (an asynchronous cleanup, say), as they would
    in a trainer that keeps running; interpreter exit would wait for them too."""
    deadline = time.monotonic() + seconds
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join(max(0.0, deadline - time.monotonic()))


def run_phases(make_request: Callable[[], Any], log: str | None) -> dict[str, int]:
    """What the async path does with a request, here, phase by phase; {phase: index of its first point}."""
    marks: dict[str, int] = {}

    def mark(phase: str) -> None:
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


def _phase_of(index: int, marks: dict[str, int]) -> str:
    """The phase a point belongs to: the last one that had started by then."""
    return [p for p in SAVE_PHASES if marks[p] <= index][-1]


def _point(p: faultfs.Point) -> str:
    return f"point {p.index} ({p.op} {p.path})"


def _commit_index(points: list[faultfs.Point], marker: str) -> int | None:
    """The first point that makes `marker` exist: a rename onto it or opening it for writing."""
    for p in points:
        if (p.op == "rename" and p.path.endswith("->" + marker)) or (p.op == "open" and p.path == marker):
            return p.index
    return None


def durability_problems(points: list[faultfs.Point], marker: str, data_glob: str) -> list[str]:
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


def crash_points(
    tmp: str, save_in_child: Callable[..., Any], phase: str, check: Callable[[], list[str]]
) -> tuple[int, int, list[str]]:
    """Trace save_in_child, then crash it after each point of `phase` and run check() after each.

    save_in_child(plan) saves in a forked process and returns its phase marks; check() returns
    problems. Returns (number of points in the phase, how many crashes fired, problems).
    """
    trace_log = os.path.join(tmp, "trace.log")
    kind, marks = in_child(tmp, "trace", save_in_child, trace_log, None)
    assert kind == "ok", f"the traced save failed: {marks}"
    points = [p for p in faultfs.read_log(trace_log) if _phase_of(p.index, marks) == phase]
    if not points:
        pytest.skip(f"the save has no persistence point in its {phase} phase")
    problems, crashed = [], 0
    for point in points:
        log = os.path.join(tmp, f"crash{point.index}.log")
        in_child(tmp, f"crash{point.index}", save_in_child, log, faultfs.Fault("crash", at=point.index), crashes=True)
        crashed += bool(faultfs.fired(log, "crash"))
        remove(log)
        problems += [f"crash after {_point(point)}: {p}" for p in check()]
    return len(points), crashed, problems


def report_crashes(points: int, crashed: int, problems: list[str]) -> None:
    assert crashed == points, f"the crash fired at {crashed} of the {points} traced points"
    assert not problems, f"{len(problems)} problems over {points} crash points:\n" + "\n".join(problems[:20])
