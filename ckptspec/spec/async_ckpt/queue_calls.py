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

from ckptspec.spec.async_ckpt.queue_results import HeadOfLine
from ckptspec.spec.harness import workloads
from ckptspec.spec.harness.asserts import bounded
from ckptspec.spec.harness.processes import async_core, wait_for_file

__all__ = ["descriptors_left_by_an_abort", "finalize_queue", "head_of_line", "lines", "request"]


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


def head_of_line(tmp, persistent):
    """Rank body: calls a (held by its gate) and b on one queue; a non-blocking poll; a's gate opened; a blocking
    finalize. Records the indices each step returned, whose finalize functions it ran, and the pending count."""
    log, gate = os.path.join(tmp, "log"), os.path.join(tmp, "gate_a")
    queue = async_core().AsyncCallsQueue(persistent=persistent)
    scheduled = {
        "a": queue.schedule_async_request(request(gate, log=log, tag="a")),
        "b": queue.schedule_async_request(request(None, log=log, tag="b")),
    }
    pending_scheduled = queue.get_num_unfinalized_calls()
    poll_returned = finalize_queue(queue, blocking=False)
    by_poll = lines(log)
    pending_after_poll = queue.get_num_unfinalized_calls()
    workloads.open_gate(gate)
    blocking_returned = finalize_queue(queue)
    by_blocking = lines(log)[len(by_poll) :]
    result = HeadOfLine(
        scheduled,
        pending_scheduled,
        poll_returned,
        by_poll,
        pending_after_poll,
        blocking_returned,
        by_blocking,
        queue.get_num_unfinalized_calls(),
    )
    queue.close()
    return result


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
