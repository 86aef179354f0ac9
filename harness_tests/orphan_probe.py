"""Run by test_dist only (not collected by a normal run): a test whose subprocess leaves a program to init.

The test starts a shell that starts `sleep` in the background and exits at once, so `sleep` is re-parented to init:
no longer a descendant of the xdist worker, but still carrying the worker's mark in its environment. It writes the
pid to $CKPTSPEC_PROBE_PID_FILE and passes.
"""

import os
import subprocess


def test_a_subprocess_leaves_a_program_to_init():
    shell = subprocess.run(
        ["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], capture_output=True, text=True, timeout=30
    )
    with open(os.environ["CKPTSPEC_PROBE_PID_FILE"], "w") as f:
        f.write(shell.stdout.strip())
