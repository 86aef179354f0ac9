"""An interrupted benchmark run keeps every finished measurement.

gpu_run stops a stage at its budget with SIGINT. The benchmark in flight then has no round recorded (or only some),
and pytest-benchmark computes every benchmark's statistics when it writes its JSON: one without a round raises
(`min() iterable argument is empty`) and the JSON, with every measurement finished before it, is lost (seen on the
H200 run of 2026-11-26 and the H100 run of 2026-11-27).

pytest-benchmark writes its JSON in a `pytest_sessionfinish` *hook wrapper*, before its `yield`: an ordinary
hook implementation, `tryfirst` or not, runs after every wrapper's first half, so the guard must be a wrapper
too, ordered first. It drops the benchmarks with no round; a benchmark interrupted after some rounds is kept
with the rounds it has (the JSON's `rounds` says how many).

This module imports neither torch nor the suite, so a test can load it alone (`-p ckptspec.bench.interrupted`);
ckptspec/bench/conftest.py re-exports the hook.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_sessionfinish(session: pytest.Session) -> Generator[None, Any, None]:
    """Drop the benchmarks that recorded no round before pytest-benchmark makes its JSON."""
    drop_unmeasured(session.config)
    yield


def drop_unmeasured(config: pytest.Config) -> None:
    """Remove, in place, every benchmark of the session with no round (no-op when benchmarks are disabled)."""
    bench_session = getattr(config, "_benchmarksession", None)
    if bench_session is not None:
        bench_session.benchmarks[:] = [bench for bench in bench_session.benchmarks if bench.stats]
