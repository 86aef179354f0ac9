"""Benchmark fixtures and report hooks (the spec plugin is loaded by pyproject.toml's addopts and the root conftest).

Options, declared in ckptspec/bench/options.py (loaded by the root conftest) so that pytest knows them however it is started: --bench-size-mib
(state dict size), --bench-rounds, --bench-saves (memory probe), --bench-dir (filesystem to measure),
--bench-sweep-mib (D2H sizes), --bench-device, --bench-threads. The `regression` marker is declared in
pyproject.toml; the default JSON path (.benchmarks/ckptspec.json) is set there too.

Without --benchmark-enable every benchmark runs its body once as a smoke test. With it, the
run writes the pytest-benchmark JSON (--benchmark-json, default .benchmarks/ckptspec.json) and
next to it the Markdown summary (`ckptspec.bench.summary`).
"""

from __future__ import annotations

import gc
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from datetime import timedelta
from importlib import metadata
from pathlib import Path

import pytest
import torch

from ckptspec.bench import goodput_plot, summary
from ckptspec.bench.harness import Bench, Paths, PeerCache
from ckptspec.bench.interrupted import pytest_sessionfinish  # noqa: F401  (the hook, registered from here)
from ckptspec.bench.workload import MiB, clone_state_dict, make_state_dict


def _enabled(config) -> bool:
    return config.ckptspec_benchmarks_enabled  # set by ckptspec.bench.options


def pytest_benchmark_update_machine_info(config, machine_info):
    machine_info["ckptspec"] = {
        "cores": os.cpu_count(),
        "device": _device(config),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "torch": torch.__version__,
        "size_mib": config.getoption("bench_size_mib"),
        "threads": torch.get_num_threads(),
        "versions": {name: _version(name) for name in ("nvidia-resiliency-ext", "megatron-core")},
    }


def pytest_benchmark_update_json(config, benchmarks, output_json):
    if not config.option.benchmark_json:
        return
    path = Path(config.option.benchmark_json).with_suffix(".md")
    path.write_text(summary.render(output_json))
    config.ckptspec_summary = [f"benchmark summary written to {path}"]
    try:
        pictures = goodput_plot.write(output_json, Path(config.option.benchmark_json))
    except ImportError:
        config.ckptspec_summary.append("goodput pictures skipped: matplotlib is not installed (extra `bench`)")
    else:
        config.ckptspec_summary += [f"goodput picture written to {p}" for p in pictures]


def pytest_terminal_summary(terminalreporter, config):
    for line in getattr(config, "ckptspec_summary", []):
        terminalreporter.write_line(f"ckptspec: {line}")


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _device(config) -> str:
    return config.getoption("bench_device") or ("cuda" if torch.cuda.is_available() else "cpu")


# ------------------------------------------------------------------------------------ fixtures


def pytest_generate_tests(metafunc):
    if "d2h_mib" in metafunc.fixturenames:
        sizes = sorted(int(s) for s in metafunc.config.getoption("bench_sweep_mib").split(","))
        sizes = sizes if _enabled(metafunc.config) else sizes[:1]
        metafunc.parametrize("d2h_mib", sizes, ids=[f"{s}MiB" for s in sizes])
    if "goodput_interval" in metafunc.fixturenames:
        intervals = sorted(int(s) for s in metafunc.config.getoption("goodput_intervals").split(","))
        if intervals[0] < 1:
            raise pytest.UsageError("--goodput-intervals must be positive")
        intervals = intervals if _enabled(metafunc.config) else intervals[:1]
        metafunc.parametrize("goodput_interval", intervals, ids=[f"every{n}" for n in intervals])


@pytest.fixture(scope="session")
def bench(request, tmp_path_factory):
    config = request.config
    size_mib, rounds = config.getoption("bench_size_mib"), config.getoption("bench_rounds")
    if size_mib <= 0 or rounds < 1 or config.getoption("bench_saves") < 1:
        raise pytest.UsageError("--bench-size-mib, --bench-rounds and --bench-saves must be positive")
    enabled = _enabled(config)
    if config.getoption("bench_threads"):
        torch.set_num_threads(config.getoption("bench_threads"))
    base = config.getoption("bench_dir")
    root = Path(tempfile.mkdtemp(prefix="ckptspec-bench-", dir=base)) if base else tmp_path_factory.mktemp("bench")
    if enabled:
        gc.freeze()  # keeps the collections between rounds short (Bench.run)
    yield Bench(
        size=int(size_mib * MiB),
        rounds=rounds,
        saves=config.getoption("bench_saves") if enabled else min(2, config.getoption("bench_saves")),
        device=_device(config),
        enabled=enabled,
        root=root,
    )
    if enabled:
        gc.unfreeze()
    if base:
        shutil.rmtree(root)


@pytest.fixture(scope="module")
def process_group(tmp_path_factory):
    """A 1-rank gloo group for the module (NVRx and Megatron-Core need one even on one rank)."""
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    store = tmp_path_factory.mktemp("store") / "store"
    dist.init_process_group(
        "gloo", store=dist.FileStore(str(store), 1), rank=0, world_size=1, timeout=timedelta(seconds=600)
    )
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def module_state_dict(bench):
    return make_state_dict(bench.size, bench.device)


@pytest.fixture
def state_dict(module_state_dict):
    """A private copy of the module's state dict for one test.

    Private because peers change the tensors they save: NVRx's persistent worker moves them into
    shared memory, after which a fork no longer snapshots them for the next peer.
    """
    return clone_state_dict(module_state_dict)


@pytest.fixture
def paths(bench):
    """paths.new() -> a fresh checkpoint path under the bench root; all removed at the end."""
    made = Paths(bench.root)
    yield made
    made.remove_all()


@pytest.fixture(scope="module")
def peers(process_group, bench):
    cache = PeerCache(bench.enabled)
    yield cache
    cache.close()


# ------------------------------------------------------------------------------ S3 on loopback


@pytest.fixture(scope="session")
def s3_endpoint(tmp_path_factory):
    """An S3 endpoint on loopback (moto server in a process of its own): its URL."""
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", "0"],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 60
        while not (match := re.search(r"Running on (http://127\.0\.0\.1:\d+)", log.read_text())):
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto server did not start:\n{log.read_text()}")
            time.sleep(0.05)
        yield match.group(1)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
