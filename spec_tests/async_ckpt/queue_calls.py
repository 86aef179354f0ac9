"""The calls the queue tests schedule and finalize: gated requests, bounded finalization, the finalize log.

Rank bodies of test_queue.py and test_queue_isolation.py build on these; each works in whatever process asks.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from spec_tests.harness import workloads
from spec_tests.harness.asserts import bounded
from spec_tests.harness.processes import async_core

__all__ = ["finalize_queue", "lines", "request"]


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
