"""Goodput: what saving every N steps costs a training loop, through each peer and without checkpointing.

Each test trains a fresh `ckptspec.bench.training.Trainer` of about --bench-size-mib of state for
max(--goodput-steps, 2 N) steps, saving every N steps (--goodput-intervals) through one peer (`none`: no
checkpointing, the baseline of the same interval), in the loop of `ckptspec.bench.goodput`. Before the loop
the peer saves the state once and waits (its worker started, its buffers allocated: the steady state
of a long training). During the loop a thread samples the host memory of the process tree. Afterwards every
checkpoint is loaded and compared with the fingerprint taken at its step. Host memory is the tree's PSS
(`ckptspec.bench.memwatch`) over what it was before the peer started: `standing_bytes` after the first save
(worker, retained buffers), `peak_extra_bytes` the largest sample during the loop. `ckptspec.bench.goodput_summary`
turns the records into goodput, slowdown, stall, interference, time to durable, memory and snapshot
verdicts; `ckptspec.bench.goodput_plot` draws them.

Without --benchmark-enable, one short run at the smallest interval per peer of SMOKE_PEERS.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

from ckptspec.bench import goodput
from ckptspec.bench.adapter_peer import regression_peer
from ckptspec.bench.harness import REGRESSION, PeerCache, record
from ckptspec.bench.memory import tree_pss
from ckptspec.bench.memwatch import TreeWatcher
from ckptspec.bench.peers import PEERS
from ckptspec.bench.training import Trainer
from ckptspec.spec.harness.surface.loading import ENV_VAR

pytestmark = pytest.mark.xdist_group("benchmarks-save")

FIGURE = "goodput"
BASELINE = "none"
IMPL_PEERS = ("dcp:impl", "dcp:impl-temporal", "dcp:impl-overlapped", "torch:impl", "torch:impl-temporal")
MEMORY_INTERVAL_S = 0.1  # a sample costs the watcher ~10 ms of CPU time, on a core the trainer may need
REGRESSION_STEPS, REGRESSION_INTERVAL = 20, 5
# The run's target's peer (ckptspec/bench/adapter_peer.py): dcp:impl, or the protocol saver of `--impl`.
REGRESSION_PEERS = (regression_peer(os.environ.get(ENV_VAR) or "impl"),)


def steps_for(interval: int, steps: int, enabled: bool) -> int:
    """Steps of a run saving every `interval` steps: the last save gets a whole interval to finish."""
    return max(steps, 2 * interval) if enabled else 2 * interval + 1


def _start(peers: PeerCache, name: str, trainer: Trainer, paths) -> object:
    """A fresh peer that has saved the state once (None for the baseline)."""
    if name == BASELINE:
        return None
    peer = peers.fresh(name)
    path = paths.new()
    peer.save(trainer.state_dict(), path)
    peer.wait()
    paths.remove(path)
    return peer


@pytest.mark.parametrize("peer_name", [BASELINE, *PEERS])
def test_goodput(benchmark, bench, request, process_group, paths, goodput_interval, peer_name):
    """One run of the training loop saving every `goodput_interval` steps through `peer_name`."""
    peers = PeerCache(bench.enabled)
    if peer_name != BASELINE:
        peers.check(peer_name)
    steps = steps_for(goodput_interval, request.config.getoption("goodput_steps"), bench.enabled)
    box: dict[str, Any] = {}

    def setup():
        box["trainer"] = trainer = Trainer(bench.size, bench.device)
        box["before"] = tree_pss(os.getpid())
        box["peer"] = _start(peers, peer_name, trainer, paths)
        box["standing"] = tree_pss(os.getpid()) - box["before"]
        box["load"] = [os.getloadavg()[0]]
        box["watcher"] = TreeWatcher(MEMORY_INTERVAL_S)

    def train():
        box["loop"] = goodput.run(box["trainer"], box["peer"], steps, goodput_interval, paths.new)

    def stop_sampling():
        box["peak"] = box.pop("watcher").stop()
        box["load"].append(os.getloadavg()[0])

    try:
        bench.run(benchmark, train, setup=setup, teardown=stop_sampling, rounds=1)
        peer, loop = box["peer"], box["loop"]
        wrong = goodput.verify(loop, peer.family, box["trainer"]) if peer else {}
    finally:
        if "watcher" in box:
            box.pop("watcher").stop()
        peers.close()
        paths.remove_all()
    if peer_name in IMPL_PEERS:
        assert not wrong, f"{peer_name}: checkpoints that do not hold their step's state: {wrong}"
    record(
        benchmark,
        bench,
        FIGURE,
        peer_name,
        bytes=box["trainer"].state_bytes,
        family=peer.family if peer else None,
        interval=goodput_interval,
        **_figures(loop, wrong),
        standing_bytes=box["standing"],
        peak_extra_bytes=box["peak"] - box["before"],
        load_average=box["load"],
    )


def _figures(loop: goodput.Loop, wrong: dict[int, list[str]]) -> dict:
    """A run's record for the summary and the picture (times in seconds, to the microsecond)."""
    return {
        "steps": len(loop.step_s),
        "wall_s": loop.wall_s,
        "step_s": [round(t, 6) for t in loop.step_s],
        "in_flight": [int(f) for f in loop.in_flight],
        "saves": [
            {
                "step": s.step,
                "wait_s": round(s.wait_s, 6),
                "call_s": round(s.call_s, 6),
                "durable_s": s.durable_s,
                "update_wait_s": None if s.update_wait_s is None else round(s.update_wait_s, 6),
            }
            for s in loop.saves
        ],
        "final_wait_s": loop.final_wait_s,
        "wrong_snapshots": {str(step): names[:3] for step, names in wrong.items()},
    }


@REGRESSION
@pytest.mark.parametrize("peer_name", [BASELINE, *REGRESSION_PEERS])
def test_goodput_regression(benchmark, bench, process_group, paths, peer_name):
    """CI's small goodput case: the run's peer (`dcp:impl`, or the protocol saver of `--impl`) saving every REGRESSION_INTERVAL of REGRESSION_STEPS steps, and the
    same loop without checkpointing (`none`), the reference the regression pass divides it by.

    Timed: the whole loop (steps, stalls, the final wait), a fresh trainer of --bench-size-mib each round,
    the peer warm; compared on its fastest round like the other regression benchmarks. Every checkpoint
    must hold its step's state.
    """
    peers, box = PeerCache(bench.enabled), dict[str, Any]()

    def setup():
        box["trainer"] = Trainer(bench.size, bench.device)
        if "peer" not in box:
            box["peer"] = _start(peers, peer_name, box["trainer"], paths)

    def train():
        box["loop"] = goodput.run(box["trainer"], box["peer"], REGRESSION_STEPS, REGRESSION_INTERVAL, paths.new)

    def check():
        if box["peer"] is not None:
            wrong = goodput.verify(box["loop"], box["peer"].family, box["trainer"])
            assert not wrong, f"{peer_name}: checkpoints that do not hold their step's state: {wrong}"
        paths.remove_all()

    try:
        bench.run(benchmark, train, setup=setup, teardown=check, warmup=1)
    finally:
        peers.close()
    record(benchmark, bench, FIGURE + "-regression", peer_name, bytes=box["trainer"].state_bytes)
