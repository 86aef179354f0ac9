"""The benchmark suite's command-line options and its default JSON path, as a pytest plugin.

Loaded however the suite is started: by the root conftest in a checkout (`pytest_plugins`), and by `-p
ckptspec.bench.options` in the addopts of an installed copy's configuration (ckptspec/spec/harness/installed.toml). The
options must be known before pytest reads the command line's paths: a sub-directory's conftest is read only when
pytest reaches that directory, or not at all before the command line is parsed (`pytest . --bench-rounds 7`,
`pytest --impl impl ...` from the root), which would make the options unknown and the JSON default too late for
pytest-benchmark. The benchmark fixtures and report hooks stay in ckptspec/bench/conftest.py.
"""

from pathlib import Path

import pytest

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
