"""The calls the queue tests schedule and finalize: gated requests, bounded finalization, the finalize log, and
the descriptors an abort leaves open.

Rank bodies of test_queue.py and test_queue_isolation.py build on these; each works in whatever process asks.
"""

from __future__ import annotations

import functools
import os
import time
from pathlib import Path

import torch

from spec_tests.harness import workloads
from spec_tests.harness.asserts import bounded
from spec_tests.harness.processes import async_core, wait_for_file

__all__ = ["descriptors_left_by_an_abort", "finalize_queue", "lines", "request"]


def request(gate=None, fail_with=None, log=None, tag=None):
    """An AsyncRequest whose async_fn waits for `gate` (then raises `fail_with`, if given) and whose finalize
    function appends `tag` to the file `log`."""
    fns = [functools.partial(workloads.append_line, log, tag)] if log else []
    return async_core().AsyncRequest(workloads.gated, (gate, fail_with), fns)


def finalize_queue(queue, blocking=True, no_dist=False, bound=60):
    """queue.maybe_finalize_async_calls(blocking, no_dist), bounded by `bound` seconds."""
    return bounded(
        bound,
        f"maybe_finalize_async_calls(blocking={blocking}, no_dist={no_dist})",
        queue.maybe_finalize_async_calls,
        blocking,
        no_dist,
    )


def lines(path):
    """The tags appended to the finalize log at `path` so far (none before the first)."""
    return Path(path).read_text().split() if os.path.exists(path) else []


def descriptors_left_by_an_abort(tmp):
    """Open descriptors of this process after close(abort=True) of a persistent queue with a call in flight that
    carries a tensor, minus those before the queue was made (a first queue warms up shared helpers)."""
    core = async_core()
    tensor = torch.arange(1 << 16, dtype=torch.float32)
    counts = []
    for n in range(2):
        before = len(os.listdir("/proc/self/fd"))
        queue = core.AsyncCallsQueue(persistent=True)
        pid_file = os.path.join(tmp, f"pid{n}")
        queue.schedule_async_request(
            core.AsyncRequest(workloads.write_pid_holding, (pid_file, os.path.join(tmp, "never-opened"), tensor), [])
        )
        wait_for_file(pid_file)
        bounded(10, "close(abort=True)", queue.close, abort=True)
        deadline = time.monotonic() + 10  # a descriptor closed by a thread shortly after close() is not leaked
        while (left := len(os.listdir("/proc/self/fd")) - before) > 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        counts.append(left)
    return counts[1]
