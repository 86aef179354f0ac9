"""Worker processes: preload in the worker, termination on close, trainer death and worker death."""

import functools
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from ckptspec.spec.harness import workloads
from ckptspec.spec.harness.asserts import HUNG, assert_equal, attempt, bounded
from ckptspec.spec.harness.processes import CALLER_CLASSES, STARTUP_BOUND, alive, async_core, wait_for_file
from ckptspec.spec.harness.ranks import ranks
from ckptspec.spec.harness.surface.loading import ENV_VAR, current_target


def _slow_preload(marker, value):
    time.sleep(0.5)  # a slow device-to-host copy: scheduling must wait for it
    with open(marker, "w") as f:
        f.write(str(os.getpid()))
    return value


@pytest.mark.spec("PC-2", "PC-3")
@pytest.mark.needs("persistent_caller")
@ranks(1, timeout=90)
def test_preload_runs_in_the_worker_before_schedule_returns_and_close_ends_it(tmp_path):
    marker, pid_file = str(tmp_path / "preloaded"), str(tmp_path / "worker")
    core = async_core()
    queue = core.AsyncCallsQueue(persistent=True)
    queue.schedule_async_request(
        core.AsyncRequest(
            workloads.write_pid,
            (pid_file, "placeholder"),
            [],
            preload_fn=functools.partial(_slow_preload, marker, None),
        )
    )
    assert os.path.exists(marker), "schedule_async_request returned before preload_fn completed"
    preload_pid = int(Path(marker).read_text())
    assert preload_pid != os.getpid(), "preload_fn ran in the trainer, not in the persistent worker"
    bounded(60, "maybe_finalize_async_calls(blocking=True)", queue.maybe_finalize_async_calls, True)
    worker = int(wait_for_file(pid_file))
    assert_equal("pid of the async call's process", worker, preload_pid, call="preload_fn ran in this process")
    bounded(30, "close()", queue.close)
    assert not alive(worker), f"worker {worker} is still running after close()"


@pytest.mark.spec("TC-1")
@pytest.mark.needs("temporal_caller")
@ranks(1, timeout=90)
def test_temporal_calls_run_in_their_own_children(tmp_path):
    core = async_core()
    queue = core.AsyncCallsQueue(persistent=False)
    files = [str(tmp_path / f"pid{i}") for i in range(2)]
    for f in files:
        queue.schedule_async_request(core.AsyncRequest(workloads.write_pid, (f,), []))
    bounded(60, "maybe_finalize_async_calls(blocking=True)", queue.maybe_finalize_async_calls, True)
    pids = [int(wait_for_file(f)) for f in files]
    assert len(set(pids)) == 2, f"calls ran in {pids}, trainer is {os.getpid()}"
    assert os.getpid() not in pids, f"calls ran in {pids}, trainer is {os.getpid()}"
    assert not any(map(alive, pids)), f"children {pids} still running after finalize"
    queue.close()


@pytest.mark.spec("TC-2")
@pytest.mark.needs("temporal_caller")
@ranks(1, timeout=120)
def test_a_lingering_temporal_child_does_not_hold_the_finalize(tmp_path):
    core = async_core()
    queue = core.AsyncCallsQueue(persistent=False)
    pid_file, gate = str(tmp_path / "pid"), str(tmp_path / "gate")
    queue.schedule_async_request(core.AsyncRequest(workloads.leave_thread_running, (pid_file, gate), []))
    try:
        finalized = attempt(
            queue.maybe_finalize_async_calls, True, bound=30, what="maybe_finalize_async_calls(blocking=True)"
        )
        child = int(wait_for_file(pid_file))
        lingering = alive(child)
    finally:
        workloads.open_gate(gate)  # lets a child that was not ended go: nothing of the test outlives it
    assert finalized.returned, f"the blocking finalize of a call whose child lingers: {finalized}, should return"
    assert finalized.value == [0], f"it finalized {finalized.value}, but should be [0]"
    assert not lingering, f"the call's child {child} still runs once its call was finalized"
    queue.close()


def _stuck_in_fork(flag: str) -> None:
    """An after-fork hook: the first child forked while `flag` exists takes it, records its pid and blocks forever,
    as a child does that is stuck inside fork (CPython < 3.11.10, gh-112275). Later children run normally."""
    try:
        os.rename(flag, flag + ".taken")  # atomic: one child only
    except FileNotFoundError:
        return
    Path(flag + ".pid").write_text(str(os.getpid()))
    while True:
        time.sleep(60)


@pytest.mark.spec("TC-3")
@pytest.mark.needs("temporal_caller")
@ranks(1, timeout=200)
def test_a_child_stuck_in_its_fork_does_not_hang_the_call(tmp_path):
    core = async_core()
    queue = core.AsyncCallsQueue(persistent=False)
    flag, pid_file = str(tmp_path / "stick"), str(tmp_path / "pid")
    Path(flag).touch()
    os.register_at_fork(after_in_child=functools.partial(_stuck_in_fork, flag))
    stuck = None
    try:
        request = core.AsyncRequest(workloads.write_pid, (pid_file,), [])
        scheduled = attempt(queue.schedule_async_request, request, bound=60, what="schedule_async_request")
        finalized = attempt(
            queue.maybe_finalize_async_calls, True, bound=60, what="maybe_finalize_async_calls(blocking=True)"
        )
        stuck = int(wait_for_file(flag + ".pid"))
        lingering = alive(stuck)
    finally:
        if stuck is not None and alive(stuck):
            os.kill(stuck, signal.SIGKILL)  # forked by this rank: ours to end, so the rank can exit
    assert scheduled.returned, f"scheduling a call whose first child is stuck in its fork: {scheduled}"
    assert finalized.text != HUNG, f"a blocking finalize of that call did not return within 60 s: {finalized}"
    if finalized.returned:
        assert finalized.value == [0], f"it finalized {finalized.value}, but should be [0]"
        ran_in = int(wait_for_file(pid_file))
        assert ran_in not in (stuck, os.getpid()), f"the call ran in {ran_in} (stuck child {stuck}, trainer)"
    assert not lingering, f"the stuck child {stuck} still runs once the finalize returned"
    queue.close()


_TRAINER = textwrap.dedent("""
    import os, signal, sys, time, torch.distributed as dist
    from ckptspec.spec.harness import async_core, workloads
    tmp = sys.argv[1]
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0, world_size=1)
    core = async_core()
    queue = core.AsyncCallsQueue(persistent=True)
    queue.schedule_async_request(core.AsyncRequest(
        workloads.write_pid, (os.path.join(tmp, "worker"), os.path.join(tmp, "never")), []))
    while not os.path.exists(os.path.join(tmp, "worker")):
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGKILL)
""")


def _outlives(pid: int, seconds: float) -> bool:
    """Whether `pid` still runs `seconds` from now; if so it is SIGKILLed (started by a process this test
    started: ours to clean up)."""
    deadline = time.monotonic() + seconds
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    orphan = alive(pid)
    if orphan:
        os.kill(pid, signal.SIGKILL)
    return orphan


@pytest.mark.spec("PC-4")
@pytest.mark.needs("persistent_caller")
@ranks(1, timeout=120)
def test_the_worker_exits_when_its_trainer_is_killed(tmp_path):
    env = dict(os.environ, **{ENV_VAR: current_target().name})
    trainer = subprocess.run([sys.executable, "-c", _TRAINER, str(tmp_path)], env=env, timeout=90)
    assert trainer.returncode == -signal.SIGKILL, f"the trainer exited with {trainer.returncode}"
    worker = int(wait_for_file(str(tmp_path / "worker")))
    assert not _outlives(worker, 10), f"worker {worker} still runs 10s after its trainer was killed"


_CALLER_USER = textwrap.dedent("""
    import os, sys, torch.distributed as dist
    from ckptspec.spec.harness import async_core, workloads
    tmp, name = sys.argv[1], sys.argv[2]
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0, world_size=1)
    core = async_core()
    caller = getattr(core, name)()
    caller.schedule_async_call(core.AsyncRequest(workloads.write_pid, (os.path.join(tmp, "worker"),), []).freeze())
    while not caller.is_current_async_call_done(True, True):
        pass
    open(os.path.join(tmp, "done"), "w").write("done")
""")  # ends here, caller still referenced: not closed


@pytest.mark.spec("PC-7")
@pytest.mark.parametrize("caller_name", CALLER_CLASSES)
def test_a_process_using_a_caller_without_close_exits(tmp_path, caller_name):
    env = dict(os.environ, **{ENV_VAR: current_target().name})
    user = subprocess.Popen([sys.executable, "-c", _CALLER_USER, str(tmp_path), caller_name], env=env)
    try:
        wait_for_file(str(tmp_path / "done"), 90)  # start-up and the call are not the subject
        code = user.wait(timeout=30)
    except subprocess.TimeoutExpired:
        code = None
    finally:
        if user.poll() is None:
            user.kill()
            user.wait()
    worker = int(wait_for_file(str(tmp_path / "worker")))
    orphan = _outlives(worker, 10)
    assert code is not None, f"a process that used a {caller_name} without close() did not exit within 30 s"
    assert not orphan, f"the {caller_name}'s process {worker} outlived its user by 10 s"
    assert code == 0, f"the process that used a {caller_name} exited with code {code}"


def _kill_worker_then_finalize(tmp):
    core = async_core()
    queue = core.AsyncCallsQueue(persistent=True)
    queue.schedule_async_request(workloads.held_call(core, tmp))
    os.kill(int(wait_for_file(os.path.join(tmp, "pid"))), signal.SIGKILL)
    return attempt(
        queue.maybe_finalize_async_calls,
        True,
        bound=30,
        hung_fails=True,
        what="maybe_finalize_async_calls(blocking=True) after the worker died",
    ).text


@pytest.mark.spec("PC-5")
@pytest.mark.needs("persistent_caller")
def test_a_dead_worker_fails_the_blocking_finalize(rank_pool, tmp_path):
    assert_equal(
        "maybe_finalize_async_calls(blocking=True)",
        # The worker's start (up to STARTUP_BOUND) is not the subject; the finalize after its death is (30 s).
        rank_pool(1).run(_kill_worker_then_finalize, str(tmp_path), timeout=STARTUP_BOUND + 60)[0],
        "CheckpointException",
        call="the persistent worker was killed while running the call",
    )
