"""An interrupted benchmark run still writes its JSON (gpu_run stops a stage at its budget with SIGINT)."""

from __future__ import annotations

from types import SimpleNamespace

from pytest_benchmark.stats import Stats

from benchmarks import conftest


def test_benchmarks_without_a_round_are_dropped_before_the_json_is_made():
    finished, in_flight = SimpleNamespace(stats=Stats()), SimpleNamespace(stats=Stats())
    finished.stats.update(0.5)
    benchmarks = [finished, in_flight]
    session = SimpleNamespace(config=SimpleNamespace(_benchmarksession=SimpleNamespace(benchmarks=benchmarks)))
    conftest.pytest_sessionfinish(session)
    assert benchmarks == [finished], "the benchmark with no round would make pytest-benchmark's JSON raise"
    conftest.pytest_sessionfinish(SimpleNamespace(config=SimpleNamespace()))  # benchmarks disabled: nothing to do
