"""Helpers shared by the benchmark modules: run settings, checkpoint paths, warm peers, records."""

from __future__ import annotations

import gc
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from ckptspec.bench import peers as peer_registry
from ckptspec.spec.harness import bounded

__all__ = [
    "REGRESSION",
    "SMOKE_PEERS",
    "Bench",
    "Paths",
    "PeerCache",
    "median",
    "noted",
    "params",
    "phase_medians",
    "record",
    "smoke_skip_reason",
]

WAIT_BOUND_S = 120.0  # plus WAIT_BOUND_S_PER_GIB per GiB saved: a peer that never finishes fails the test
WAIT_BOUND_S_PER_GIB = 60.0
CLOSE_BOUND_S = 60.0
SMOKE_PEERS = (
    "dcp:impl",
    "dcp:impl-temporal",
    "torch:impl",
    "torch:impl-temporal",
    "dcp:async_save-thread",
    "dcp:save",
    "torch:save",
)


REGRESSION = pytest.mark.regression
"""Marks the benchmarks of CI's regression pass (`-m regression`): impl's own figures and two ceilings."""


def params(names, regression=()) -> list:
    """pytest params for `names`, those in `regression` marked for CI's regression pass."""
    return [pytest.param(name, marks=REGRESSION if name in regression else ()) for name in names]


def smoke_skip_reason(name: str) -> str:
    return f"{name} runs with --benchmark-enable only (smoke mode runs impl and the in-process peers)"


@dataclass(frozen=True)
class Bench:
    """The run's settings. `enabled` is False in smoke mode (benchmarks run once, untimed)."""

    size: int
    rounds: int
    saves: int
    device: str
    enabled: bool
    root: Path

    def run(self, benchmark, target, *, setup=None, teardown=None, warmup: int = 0, rounds: int | None = None):
        """benchmark.pedantic with teardown also run in smoke mode (pedantic skips it there).

        When timing, each round's setup ends with a garbage collection: in a process as large as a
        pytest session, a collection that happens to start inside the timed call costs ~100 ms,
        whichever peer's allocation triggered it (the `bench` fixture freezes the objects that exist
        before the benchmarks, so these collections are quick).
        """

        def prepare():
            if setup is not None:
                setup()
            if self.enabled:
                gc.collect()

        result = benchmark.pedantic(
            target,
            setup=prepare,
            teardown=teardown,
            rounds=rounds or self.rounds,
            warmup_rounds=warmup if self.enabled else 0,
        )
        if not self.enabled and teardown is not None:
            teardown()
        return result

    def wait(self, peer) -> None:
        """peer.wait(), failing the test if it has not returned within the bound."""
        limit = WAIT_BOUND_S + WAIT_BOUND_S_PER_GIB * self.size / (1 << 30)
        bounded(limit, f"{peer.name}.wait()", peer.wait)


class Paths:
    """Fresh checkpoint paths under the bench root, removed by exact path."""

    def __init__(self, root: Path):
        self.root, self.count = root, 0
        self.made: list[str] = []

    def new(self) -> str:
        self.count += 1
        path = str(self.root / f"ckpt-{os.getpid()}-{time.monotonic_ns()}-{self.count}")
        self.made.append(path)
        return path

    @staticmethod
    def remove(path: str) -> None:
        if os.path.isdir(path):
            shutil.rmtree(path)
        elif os.path.exists(path):
            os.remove(path)

    def remove_all(self) -> None:
        for path in self.made:
            self.remove(path)
        self.made.clear()


class PeerCache:
    """One warm instance per peer for a module; `fresh` replaces it with a new one.

    In smoke mode only SMOKE_PEERS run: the others start a worker, a Manager or torch's checkpoint
    process (seconds each), or import Megatron-Core; CI's smoke pass stays within its budget.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.live: dict[str, peer_registry.Peer] = {}

    def get(self, name: str) -> peer_registry.Peer:
        return self.live[name] if name in self.live else self.fresh(name)

    def check(self, name: str) -> None:
        """Skip the test if peer `name` cannot run here (call before timing: a skip inside
        benchmark.pedantic would leave an empty benchmark behind)."""
        if not self.enabled and name not in SMOKE_PEERS:
            pytest.skip(smoke_skip_reason(name))
        reason = peer_registry.unavailable(name)
        if reason:
            pytest.skip(reason)

    def fresh(self, name: str) -> peer_registry.Peer:
        self.check(name)
        old = self.live.pop(name, None)
        if old is not None:
            old.close()
        self.live[name] = peer_registry.make_peer(name)
        return self.live[name]

    def close(self) -> None:
        for peer in self.live.values():
            bounded(CLOSE_BOUND_S, f"{peer.name}.close()", peer.close)
        self.live.clear()


def record(benchmark, bench: Bench, figure: str, peer: str, **info) -> None:
    """Attach what the summary needs to the benchmark: the figure, the peer, the bytes, the device."""
    benchmark.extra_info.update(figure=figure, peer=peer, device=bench.device, **info)
    benchmark.extra_info.setdefault("bytes", bench.size)


def noted(peer) -> dict[str, str]:
    """The peer's `note` as extra_info, where it has one (the summary shows it beside the peer's name)."""
    return {"note": peer.note} if peer.note else {}


def median(values) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else float("nan")


def phase_medians(phases: list[dict]) -> dict[str, float]:
    return {key: median(p[key] for p in phases) for key in phases[0]} if phases else {}
