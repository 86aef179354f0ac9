"""Watch the watchmen: the multi-rank runner reports failing, hung and killed ranks, and cleans up."""

import os
import shutil
import signal
import subprocess
import tempfile
import time

import pytest
import torch
import torch.distributed as dist

from ckptspec.spec.harness.processes import alive
from ckptspec.spec.harness.ranks import RankFailures, RankPool, launched, rank_state, ranks, run_on_ranks, world
from harness_tests.pytest_runs import clean_env, run_pytest


def _sum_of_ranks():
    t = torch.tensor([dist.get_rank()])
    dist.all_reduce(t)
    return int(t.item()), world()


def _rank1_raises():
    if dist.get_rank() == 1:
        raise AssertionError("rank 1 saw a bad checksum")
    dist.barrier()


def _rank1_hangs_in_named_function():
    if dist.get_rank() == 1:
        _a_function_that_never_returns()


def _a_function_that_never_returns():
    while True:
        time.sleep(0.05)


def _rank1_kills_itself():
    if dist.get_rank() == 1:
        os.kill(os.getpid(), signal.SIGKILL)


def _rank0_skips():
    pytest.skip("rank 0 has no GPU")


def _start_grandchild_then_hang(pid_file):
    child = subprocess.Popen(["sleep", "300"])
    with open(pid_file, "w") as f:
        f.write(str(child.pid))
    _a_function_that_never_returns()


def _start_escapees(tmp):
    """Two processes that leave the rank's process group: one in its own session, one whose parent exits."""
    own_session = subprocess.Popen(["sleep", "300"], start_new_session=True)
    shell = subprocess.run(
        ["sh", "-c", "setsid sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, check=True
    )
    return [own_session.pid, int(shell.stdout)]


def _remember(value):
    rank_state["value"] = value
    return value


def _recall():
    return rank_state.get("value")


def test_results_come_back_from_every_rank():
    assert run_on_ranks(_sum_of_ranks, 3) == [(3, (r, 3)) for r in range(3)]


def test_a_failing_rank_is_reported_with_every_other_rank():
    with pytest.raises(RankFailures) as info:
        run_on_ranks(_rank1_raises, 2, timeout=30)
    text = str(info.value)
    assert "rank 1 raised" in text
    assert "rank 1 saw a bad checksum" in text
    assert "rank 0" in text


# The timeout of the two tests of a stopped rank covers the ranks' start (a gloo group on a loaded 2-core runner
# took over 5 s): long enough for the rank to reach what it does, short enough to keep the tests cheap.
STOP_S = 20


def test_a_hung_rank_is_reported_with_its_stack():
    with pytest.raises(RankFailures) as info:
        run_on_ranks(_rank1_hangs_in_named_function, 2, timeout=STOP_S)
    text = str(info.value)
    assert f"rank 1 did not finish within {STOP_S}s" in text
    assert "_a_function_that_never_returns" in text
    assert "rank 0: ok" in text


@pytest.mark.skipif(launched.active(), reason="kills a launched rank without declaring it: the job would end")
def test_an_unexpected_death_is_reported_with_its_exit_code():
    with pytest.raises(RankFailures) as info:
        run_on_ranks(_rank1_kills_itself, 2, timeout=30)
    assert f"rank 1 exited with code {-signal.SIGKILL}" in str(info.value)


def test_a_declared_death_is_not_a_failure():
    results = run_on_ranks(_rank1_kills_itself, 2, timeout=30, expect_exit={1: -signal.SIGKILL})
    assert results == [None, None]


def test_a_declared_death_that_does_not_happen_is_a_failure():
    with pytest.raises(RankFailures) as info:
        run_on_ranks(_sum_of_ranks, 2, timeout=30, expect_exit={1: -signal.SIGKILL})
    assert "rank 1 was expected to exit" in str(info.value)


def test_a_skip_on_a_rank_skips_the_test():
    with pytest.raises(pytest.skip.Exception, match="rank 0 has no GPU"):
        run_on_ranks(_rank0_skips, 2, timeout=30)


def _session_and_group():
    return os.getpid(), os.getsid(0), os.getpgid(0)


@pytest.mark.skipif(launched.active(), reason="a launched rank is torchrun's child, in torchrun's session")
def test_a_forked_rank_leads_its_own_session():
    # P-EXIT-1 looks for what outlived a rank in its session: a worker that left the rank's group (impl's calls
    # setpgid) was missed while ranks led only a group.
    for pid, sid, pgid in run_on_ranks(_session_and_group, 2, timeout=30):
        assert sid == pgid == pid, f"rank {pid}: session {sid}, group {pgid}"


def test_processes_started_by_a_stopped_rank_are_ended(tmp_path):
    pid_file = tmp_path / "grandchild.pid"
    with pytest.raises(RankFailures):
        run_on_ranks(_start_grandchild_then_hang, 1, (str(pid_file),), timeout=STOP_S)
    pid = int(pid_file.read_text())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.05)
    assert not alive(pid), f"grandchild {pid} of a stopped rank is still running"


@pytest.mark.skipif(launched.active(), reason="launched ranks find only their descendants (README: torchrun)")
def test_processes_that_left_a_ranks_process_group_are_ended(tmp_path):
    pids = run_on_ranks(_start_escapees, 1, (str(tmp_path),), timeout=30)[0]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(alive(pid) for pid in pids):
        time.sleep(0.05)
    assert not [pid for pid in pids if alive(pid)], f"of {pids}, started by a rank in sessions of their own, these run"


def test_a_pool_keeps_rank_state_and_respawns_after_a_failure():
    pool = RankPool(2, timeout=10)
    try:
        assert pool.run(_remember, 7) == [7, 7]
        assert pool.run(_recall) == [7, 7]
        with pytest.raises(RankFailures, match="rank 1 raised"):
            pool.run(_rank1_raises)
        assert pool.run(_recall) == [None, None], "a respawned pool starts with fresh ranks"
        assert pool.run(_sum_of_ranks) == [(1, (0, 2)), (1, (1, 2))]
    finally:
        pool.close()


def test_a_pool_reports_a_hung_rank_and_recovers():
    pool = RankPool(2, timeout=5)
    try:
        with pytest.raises(RankFailures, match="rank 1 did not finish"):
            pool.run(_rank1_hangs_in_named_function)
        assert pool.run(_sum_of_ranks)[0][0] == 1
    finally:
        pool.close()


@ranks(2, timeout=60)
def test_the_decorator_runs_the_body_on_every_rank_with_fixtures(tmp_path):
    rank, size = world()
    (tmp_path / f"rank{rank}").write_text(str(size))
    dist.barrier()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank0", "rank1"]


def test_functions_defined_inside_tests_are_refused():
    def local():
        return 1

    with pytest.raises(TypeError, match="module-level"):
        run_on_ranks(local, 1)


@pytest.mark.skipif(launched.active(), reason="runs pytest-xdist in a subprocess, not a launched body")
def test_what_a_test_left_to_init_is_ended_when_its_xdist_worker_finishes(tmp_path):
    # Found running 1 h 40 min after a run: NVRx's persistent workers, left by a test's script that had ended.
    pid_file = tmp_path / "orphan.pid"
    run = run_pytest(
        ["-n", "1", "-p", "no:randomly", "harness_tests/orphan_probe.py"],
        env=clean_env(CKPTSPEC_PROBE_PID_FILE=str(pid_file)),
    )
    assert pid_file.exists(), run.describe()
    pid = int(pid_file.read_text())
    try:
        assert not alive(pid), f"pid {pid}, left to init by a test's subprocess, still runs\n{run.describe()}"
        assert f"left running, killed: at the end of the session: pid {pid}" in run.output, run.describe()
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)  # the program the probe started, by its exact pid


@pytest.mark.skipif(launched.active(), reason="runs pytest-xdist in a subprocess, not a launched body")
def test_what_a_crashed_xdist_worker_left_running_is_ended(tmp_path):
    pid_file = tmp_path / "orphan.pid"
    # The crashed worker cannot remove its rank pool's directory: it goes to a TMPDIR of this test (short, for the
    # AF_UNIX socket paths multiprocessing puts there), removed below, never to the machine's /tmp.
    tmpdir = tempfile.mkdtemp(prefix="ckptspec-t-")
    try:
        run = run_pytest(
            ["-n", "1", "-p", "no:randomly", "harness_tests/crashing_worker.py"],
            env=clean_env(CKPTSPEC_PROBE_PID_FILE=str(pid_file), TMPDIR=tmpdir),
        )
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    assert pid_file.exists(), run.describe()
    pid = int(pid_file.read_text())
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and alive(pid):
            time.sleep(0.05)
        assert not alive(pid), f"pid {pid}, started on a rank of the crashed worker, still runs\n{run.describe()}"
        assert f"after xdist worker gw0 crashed: pid {pid}" in run.output, run.describe()
    finally:
        if alive(pid):
            os.kill(pid, signal.SIGKILL)  # the program the probe started, by its exact pid


@pytest.mark.skipif(launched.active(), reason="runs pytest-xdist in a subprocess, not a launched body")
def test_a_run_leaves_no_multiprocessing_directory_behind():
    # Each suite run once left 8 to 10 /tmp/pymp-* directories: forked pytest runs that ended with os._exit, and
    # impl's slab descriptors sent through multiprocessing's resource sharer (a listener with a socket there).
    tmpdir = tempfile.mkdtemp(prefix="ckptspec-t-")  # the run's TMPDIR: short, for the AF_UNIX socket paths
    try:
        run = run_pytest(
            [
                "-n",
                "1",
                "-p",
                "no:randomly",
                "--impl",
                "impl",
                "ckptspec/spec/async_ckpt/test_queue.py::test_close_finalizes_every_pending_call",
            ],
            env=clean_env(TMPDIR=tmpdir),
            fresh=True,  # a new interpreter, whose tempfile module reads this TMPDIR
        )
        left = sorted(name for name in os.listdir(tmpdir) if name.startswith("pymp-"))
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    assert run.code == 0, run.describe()
    assert "2 passed" in run.output, run.describe()  # the persistent and the temporal caller
    assert not left, f"the run left {left} in its TMPDIR\n{run.describe()}"
