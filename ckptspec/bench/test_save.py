"""Saving through every peer: trainer stall, time to durable and committed, memory, load time.

Each peer saves the module's state dict (--bench-size-mib) into a fresh path; between timed rounds
the previous save is waited for, as a trainer that saves every few steps would. Phases (planning,
scheduling = staging + hand-off) are recorded where the peer's API separates them.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from time import perf_counter, thread_time

import pytest

from ckptspec.bench.adapter_peer import regression_peer
from ckptspec.bench.harness import noted, params, phase_medians, record
from ckptspec.bench.peers import PEERS, unavailable
from ckptspec.bench.workload import MiB, load_checkpoint, negate_, saved_before_update, staged_bytes
from ckptspec.spec.harness.surface.loading import ENV_VAR

# One xdist worker runs this module under `--dist loadgroup`, so the peers' workers start once.
pytestmark = pytest.mark.xdist_group("benchmarks-save")

ALL = list(PEERS)
LOADABLE = [name for name in PEERS if name.startswith("dcp:")] + ["torch:save"]
SMOKE_MEMORY_PEERS = ("dcp:impl-temporal",)  # forks its writer: no worker to start
# In CI's regression pass: the peer of the run's target, set by the spec plugin before collection (`--impl`):
# dcp:impl for impl (torch:impl would start a second worker), an adapter's protocol saver otherwise.
IMPL = (regression_peer(os.environ.get(ENV_VAR) or "impl"),)
TIMED = [*ALL, *(name for name in IMPL if name not in ALL)]


def timed_save(peer, state_dict, path: str) -> dict[str, float]:
    """peer.save, then peer.before_update(): the trainer's stall lasts until it may change the state, so a peer that
    returns before its snapshot is taken (a staging signal, DCP's DefaultStager) is timed until staging ended too.

    Phases: the peer's own, "staging wait" (the time in before_update) and "cpu" (this thread's CPU time in both;
    on a shared machine the wall-clock stall includes time spent descheduled, the CPU time does not).
    """
    cpu = thread_time()
    phases = peer.save(state_dict, path)
    waited = perf_counter()
    peer.before_update()
    phases["staging wait"] = perf_counter() - waited
    phases["cpu"] = thread_time() - cpu
    return phases


@pytest.mark.parametrize("peer_name", ALL)
def test_first_save_stall(benchmark, bench, peers, state_dict, paths, peer_name):
    """Stall of a peer's first save (fresh instance each round: no worker, no cached plan yet)."""
    peers.check(peer_name)
    rounds, box = [], {}

    def setup():
        box["peer"], box["path"] = peers.fresh(peer_name), paths.new()

    def save():
        box["start"] = perf_counter()
        rounds.append(timed_save(box["peer"], state_dict, box["path"]))

    def finish():
        bench.wait(box["peer"])
        rounds[-1]["durable"] = perf_counter() - box["start"]
        paths.remove(box["path"])

    bench.run(benchmark, save, setup=setup, teardown=finish)
    record(
        benchmark,
        bench,
        "stall-first",
        peer_name,
        family=box["peer"].family,
        **noted(box["peer"]),
        bytes=staged_bytes(state_dict),
        phases=phase_medians(rounds[-bench.rounds :]),
    )


@pytest.mark.parametrize("peer_name", params(TIMED, regression=IMPL))
def test_stall(benchmark, bench, peers, state_dict, paths, peer_name):
    """Steady-state stall: from the call that schedules a save until the trainer may change the state (its return,
    and the wait for staging where the peer signals it), worker already warm.

    Afterwards one more save checks the snapshot: the state dict is updated in place right after
    the call returns (and `before_update()`, where a staged peer waits for its staging), and the
    checkpoint must still hold the values from the call.
    """
    peer, rounds, box = peers.get(peer_name), [], {}

    def setup():
        box["path"] = paths.new()

    def save():
        rounds.append(timed_save(peer, state_dict, box["path"]))

    def finish():
        bench.wait(peer)
        paths.remove(box["path"])

    bench.run(benchmark, save, setup=setup, teardown=finish, warmup=1)
    path = paths.new()
    timed_save(peer, state_dict, path)
    negate_(state_dict)
    bench.wait(peer)
    correct = saved_before_update(peer.family, path, state_dict)
    record(
        benchmark,
        bench,
        "stall",
        peer_name,
        family=peer.family,
        **noted(peer),
        bytes=staged_bytes(state_dict),
        phases=phase_medians(rounds[-bench.rounds :]),
        snapshot="correct" if correct else "wrong",
    )


@pytest.mark.parametrize("peer_name", params(TIMED, regression=IMPL))
def test_time_to_durable(benchmark, bench, peers, state_dict, paths, peer_name):
    """From the call that schedules a save until the checkpoint is committed and finalized.

    Committed means `.metadata` is in place for `dcp` peers and the file is complete for `torch`
    peers; `durable` records whether the peer fsyncs the data first (torch.save does not).
    """
    peer, box = peers.get(peer_name), {}

    def setup():
        box["path"] = paths.new()

    def save_and_wait():
        peer.save(state_dict, box["path"])
        bench.wait(peer)

    def check_and_remove():
        marker = os.path.join(box["path"], ".metadata") if peer.family == "dcp" else box["path"]
        assert os.path.exists(marker), f"{peer_name}: {marker} missing after the save was finalized"
        paths.remove(box["path"])

    bench.run(benchmark, save_and_wait, setup=setup, teardown=check_and_remove, warmup=1)
    record(
        benchmark,
        bench,
        "durable",
        peer_name,
        family=peer.family,
        **noted(peer),
        bytes=staged_bytes(state_dict),
        durable=peer.durable,
    )


@pytest.mark.parametrize("peer_name", params([*LOADABLE, *(n for n in IMPL if n not in LOADABLE)], regression=IMPL))
def test_load(benchmark, bench, peers, state_dict, paths, peer_name):
    """Loading what the peer saved, into fresh CPU tensors (`dcp.load`, or `torch.load`)."""
    peer, path = peers.get(peer_name), paths.new()
    peer.save(state_dict, path)
    bench.wait(peer)
    bench.run(benchmark, lambda: load_checkpoint(peer.family, path, state_dict))
    record(benchmark, bench, "load", peer_name, family=peer.family, **noted(peer), bytes=staged_bytes(state_dict))


def run_in_own_group(command: list[str], cwd, timeout: float) -> tuple[int, str]:
    """Run command in a new process group; on timeout kill the whole group (workers included)."""
    process = subprocess.Popen(
        command, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        raise AssertionError(f"{' '.join(command)} did not finish within {timeout:g}s") from None
    return process.returncode, stderr


@pytest.mark.parametrize("peer_name", ALL)
def test_memory(benchmark, bench, request, peer_name):
    """Host memory over --bench-saves consecutive saves, in a process of the peer's own.

    See ckptspec/bench/memory.py for the figures. Without --benchmark-enable only SMOKE_MEMORY_PEERS
    run (each probe starts a Python process and the peer's workers).
    """
    if not bench.enabled and peer_name not in SMOKE_MEMORY_PEERS:
        pytest.skip(f"memory probes run with --benchmark-enable (smoke mode runs {', '.join(SMOKE_MEMORY_PEERS)})")
    reason = unavailable(peer_name)
    if reason:
        pytest.skip(reason)
    workdir = tempfile.mkdtemp(prefix="memory-", dir=bench.root)
    out = os.path.join(workdir, "figures.json")
    command = [
        sys.executable,
        "-m",
        "ckptspec.bench.memory",
        "--peer",
        peer_name,
        "--size-mib",
        str(bench.size / MiB),
        "--saves",
        str(bench.saves),
        "--dir",
        workdir,
        "--device",
        bench.device,
        "--json",
        out,
    ]
    timeout = 300 + bench.saves * 60 * bench.size / (1 << 30)

    def probe():
        returncode, stderr = run_in_own_group(command, request.config.rootpath, timeout)
        assert returncode == 0, f"memory probe failed ({returncode}):\n{stderr[-4000:]}"

    try:
        bench.run(benchmark, probe, rounds=1)
        with open(out) as f:
            figures = json.load(f)
    finally:
        shutil.rmtree(workdir)
    record(benchmark, bench, "memory", peer_name, bytes=figures["staged_bytes"], memory=figures)
