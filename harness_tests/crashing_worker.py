"""Run by test_dist only (not collected by a normal run): an xdist worker that dies with its ranks' children alive.

The test starts a program on a warm rank, writes its pid to $CKPTSPEC_PROBE_PID_FILE, and SIGKILLs its own xdist
worker, as the OOM killer would: the ranks end (their pipe to the worker closes), the program is left to init.
"""

import os
import signal
import subprocess


def _start_sleeper():
    return subprocess.Popen(["sleep", "300"]).pid


def test_the_worker_dies_with_a_program_of_its_rank_running(rank_pool):
    (pid,) = rank_pool(1).run(_start_sleeper)
    with open(os.environ["CKPTSPEC_PROBE_PID_FILE"], "w") as f:
        f.write(str(pid))
    os.kill(os.getpid(), signal.SIGKILL)
