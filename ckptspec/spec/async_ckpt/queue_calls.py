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

from ckptspec.spec.async_ckpt.queue_results import DefaultQueue, HeadOfLine, TwoQueues
from ckptspec.spec.harness import workloads
from ckptspec.spec.harness.asserts import bounded
from ckptspec.spec.harness.processes import async_core, wait_for_file

__all__ = [
    "FINALIZE_BOUND",
    "default_queue",
    "descriptors_left_by_an_abort",
    "finalize_queue",
    "head_of_line",
    "lines",
    "request",
    "two_queues",
]

FINALIZE_BOUND = 60.0
"""Seconds the spec gives a blocking finalize of calls that have begun (finalize_queue's default bound)."""


def request(gate=None, fail_with=None, log=None, tag=None, ran=None):
    """An AsyncRequest whose async_fn waits for `gate` (then raises `fail_with`, if given) and whose finalize
    function appends `tag` to the file `log`. With `ran`, the async_fn first writes its pid to that file (see
    `wait_until_run`)."""
    fns = [functools.partial(workloads.append_line, log, tag)] if log else []
    if ran is not None:
        assert fail_with is None, "a request that records its run does not fail"
        return async_core().AsyncRequest(workloads.write_pid, (ran, gate), fns)
    return async_core().AsyncRequest(workloads.gated, (gate, fail_with), fns)


def wait_until_run(*paths):
    """Wait (up to STARTUP_BOUND each, outside any spec bound) until each call has run its async_fn (written its
    file): a persistent caller's first call waits for its worker, a fresh interpreter that imports torch and the
    target (over 30 s on a loaded 2-core machine), and that start-up is not what a finalize bound judges."""
    for path in paths:
        wait_for_file(path)


def finalize_queue(queue, blocking=True, no_dist=False, bound=None):
    """queue.maybe_finalize_async_calls(blocking, no_dist), bounded by `bound` seconds (FINALIZE_BOUND)."""
    bound = FINALIZE_BOUND if bound is None else bound
    return bounded(
        bound,
        f"maybe_finalize_async_calls(blocking={blocking}, no_dist={no_dist})",
        queue.maybe_finalize_async_calls,
        blocking,
        no_dist,
    )


def default_queue(tmp):
    """Rank body (PC-1, AQ-1, AQ-2): two requests on AsyncCallsQueue() and one on a second queue; the indices, and
    how many processes ran the two requests. The calls have run (their pid files) before the bounded finalize."""
    core = async_core()
    queue = core.AsyncCallsQueue()
    pids = [os.path.join(tmp, f"pid{i}") for i in range(2)]
    idx = [queue.schedule_async_request(core.AsyncRequest(workloads.write_pid, (p,), [])) for p in pids]
    wait_until_run(*pids)
    finalize_queue(queue)
    other = core.AsyncCallsQueue()
    other_idx = other.schedule_async_request(core.AsyncRequest(None, (), []))
    finalize_queue(other)
    other.close()
    queue.close()
    runners = {int(Path(p).read_text()) for p in pids}
    return DefaultQueue(idx, other_idx, len(runners), os.getpid() in runners)


def two_queues(tmp, persistent):
    """Rank body (AQ-13): two calls on each of two queues, interleaved; finalize the first, then the second. Every
    call has run before the first bounded finalize."""
    log = os.path.join(tmp, "log")
    q1, q2 = (async_core().AsyncCallsQueue(persistent=persistent) for _ in range(2))
    scheduled = [
        (q.schedule_async_request(request(None, log=log, tag=f"{name}{i}", ran=os.path.join(tmp, f"ran-{name}{i}"))))
        for i in range(2)
        for name, q in (("x", q1), ("y", q2))
    ]
    wait_until_run(*(os.path.join(tmp, f"ran-{name}{i}") for i in range(2) for name in "xy"))
    finalize_queue(q1)
    first = sorted(lines(log)), q1.get_num_unfinalized_calls(), q2.get_num_unfinalized_calls()
    finalize_queue(q2)
    q1.close(), q2.close()
    return TwoQueues(scheduled, *first, sorted(lines(log)))


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
