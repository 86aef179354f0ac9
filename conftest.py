"""Root conftest: what pytest must know before it collects any directory, whichever way the suite is started.

- The spec plugin (`spec_tests.harness.plugin`; also loaded by `-p` in pyproject.toml's addopts, so this line
  matters only for a run with another ini file).
- The benchmark suite's command-line options and its default JSON path. They live here, not in
  benchmarks/conftest.py, because a sub-directory's conftest is read only when pytest reaches that directory,
  or not at all before the command line is parsed (`pytest . --bench-rounds 7`, `pytest --impl impl ...`
  from the root), which would make the options unknown and the JSON default too late for pytest-benchmark.
  The benchmark fixtures and report hooks stay in benchmarks/conftest.py.

Markers are declared in pyproject.toml (`markers`) or by the spec plugin, never in a sub-directory's conftest.
"""

from pathlib import Path

import pytest

pytest_plugins = ("spec_tests.harness.plugin",)

BENCH_JSON = ".benchmarks/ckptspec.json"


def pytest_addoption(parser):
    group = parser.getgroup("ckptspec benchmarks")
    group.addoption(
        "--bench-size-mib",
        type=float,
        default=8.0,
        help="state dict size in MiB (default 8: smoke and CI; 1024 for a full run)",
    )
    group.addoption("--bench-rounds", type=int, default=5, help="timed rounds per benchmark (default 5)")
    group.addoption(
        "--bench-saves",
        type=int,
        default=20,
        help="consecutive saves per memory probe (default 20; 2 without --benchmark-enable)",
    )
    group.addoption(
        "--bench-dir",
        default=None,
        help="directory on the filesystem to measure (default: pytest's temporary directory)",
    )
    group.addoption(
        "--bench-sweep-mib",
        default="64,256,1024,4096,8192",
        help="D2H sizes in MiB, comma-separated (only the smallest without --benchmark-enable)",
    )
    group.addoption(
        "--bench-device",
        default=None,
        choices=["cpu", "cuda"],
        help="device of the state dict (default: cuda if available)",
    )
    group.addoption(
        "--goodput-intervals",
        default="1,10,100",
        help="save intervals of the goodput benchmark, in steps, comma-separated (only the smallest without "
        "--benchmark-enable)",
    )
    group.addoption(
        "--goodput-steps",
        type=int,
        default=100,
        help="training steps of a goodput run (at least twice its save interval; default 100)",
    )
    group.addoption(
        "--bench-threads",
        type=int,
        default=None,
        help="torch intra-op threads of the trainer (default: torch's). 1 steadies timings on a "
        "shared machine, where a parallel copy waits for a descheduled OpenMP thread",
    )


def benchmarks_enabled(config) -> bool:
    """Whether pytest-benchmark times this run (--benchmark-enable over the addopts' --benchmark-disable)."""
    return not (config.getoption("benchmark_disable") and not config.getoption("benchmark_enable"))


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    config.ckptspec_benchmarks_enabled = benchmarks_enabled(config)
    # Before pytest-benchmark builds its session, so that it sees the default JSON path.
    if (
        config.ckptspec_benchmarks_enabled
        and not config.getoption("benchmark_json")
        and not hasattr(config, "workerinput")
    ):
        Path(config.rootpath, BENCH_JSON).parent.mkdir(exist_ok=True)
        # A path, as pytest-benchmark (>= 5.3) parses its own --benchmark-json.
        config.option.benchmark_json = Path(config.rootpath, BENCH_JSON)
