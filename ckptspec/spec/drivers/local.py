"""Helpers for the local checkpointing tests: node-local roots, managers on ranks, the clique model.

Every rank gets its own root, ``<base>/node<rank>``, as if each rank ran on its own node with its own
local SSD. Losing a node is then target-neutral: delete that directory (no knowledge of the target's
file layout is needed) and start fresh rank processes.

Fresh rank processes import the module of the function they run; this one stays light (no
hypothesis), so the functions that run right after a restart live here.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from ckptspec.spec.drivers.cpu_state_dict import CpuTensorAwareStateDict
from ckptspec.spec.harness.asserts import assert_each_rank, assert_state_dict_equal, attempt, bounded
from ckptspec.spec.harness.processes import async_core, remove
from ckptspec.spec.harness.ranks import rank_state, world
from ckptspec.spec.harness.surface.loading import current_target

__all__ = [
    "BOUND",
    "PART_SLACK",
    "PAYLOAD",
    "Found",
    "assert_found",
    "assert_nothing_found",
    "cliques",
    "find_then_load",
    "fresh_find_then_load",
    "lose_nodes",
    "manager",
    "module",
    "node_root",
    "rank_value",
    "save",
    "save_values",
    "storage_bytes",
    "strategy",
    "tasd",
    "try_save_values",
]

BOUND = 60.0
"""Seconds any one collective call of a manager may take in these tests (they move a few KiB)."""


def module(name: str) -> Any:
    """The target's local module, e.g. module("ckpt_managers.local_manager")."""
    return current_target().module("local." + name)


def node_root(base: str, rank: int) -> str:
    return os.path.join(base, f"node{rank}")


def lose_nodes(base: str, lost: Iterable[int]) -> None:
    """Delete the local storage of the `lost` ranks (the rank pool must be restarted afterwards)."""
    remove(*(node_root(base, rank) for rank in lost))


def strategy(replication: tuple[int, int] | None) -> Any:
    """The target's CliqueReplicationStrategy for replication=(jump, factor), or None.

    Cached per rank process: creating one creates process groups, a collective every rank repeats.
    """
    if replication is None:
        return None
    cache = rank_state.setdefault("strategies", {})
    if replication not in cache:
        strategies = module("replication.strategies")
        cache[replication] = strategies.CliqueReplicationStrategy.from_replication_params(*replication)
    return cache[replication]


def manager(base: str, replication: tuple[int, int] | None = None) -> Any:
    """A new LocalCheckpointManager for this rank, on this rank's node-local root."""
    rank, _ = world()
    lm = module("ckpt_managers.local_manager")
    return lm.LocalCheckpointManager(node_root(base, rank), repl_strategy=strategy(replication))


def tasd(state_dict: dict[str, Any]) -> CpuTensorAwareStateDict:
    """The suite's CPU TensorAwareStateDict over a copy of state_dict.

    The copy's tensors live in private memory, like a trainer's (what arrives over the rank pool's
    pipe is in shared memory)."""
    return CpuTensorAwareStateDict(copy.deepcopy(state_dict))


def save(mgr: Any, state: CpuTensorAwareStateDict, iteration: int, mode: str = "sync") -> Any:
    """Save and wait until the save is finalized; return what save() returned.

    mode: "sync" (is_async=False), or "temporal" / "persistent" (is_async=True through a new AsyncCallsQueue
    of that kind, closed afterwards)."""
    if mode == "sync":
        return bounded(BOUND, "save(is_async=False)", mgr.save, state, iteration, is_async=False)
    request = bounded(BOUND, "save(is_async=True)", mgr.save, state, iteration, is_async=True)
    calls = async_core().AsyncCallsQueue(persistent=mode == "persistent")
    calls.schedule_async_request(request)
    bounded(BOUND, "maybe_finalize_async_calls(blocking=True)", calls.maybe_finalize_async_calls, True)
    bounded(BOUND, "AsyncCallsQueue.close()", calls.close)
    return request


@dataclass(frozen=True)
class Found:
    """What a rank's find_latest() and load() gave."""

    latest: int  # find_latest()
    load: str  # "returned", or the class name of what load() raised
    part_id: tuple[Any, ...] | None = None  # load()'s
    state_dict: dict[str, Any] | None = field(default=None, compare=False, repr=False)  # load()'s; see assert_found


def find_then_load(mgr: Any) -> Found:
    """find_latest(), then load() whatever it found. Every call is bounded; a bound exceeded fails the rank."""
    latest = bounded(BOUND, "find_latest()", mgr.find_latest)
    loaded = attempt(mgr.load, bound=BOUND, what="load()", hung_fails=True)
    if not loaded.returned:
        return Found(latest, loaded.text)
    tensors, part_id = loaded.value
    return Found(latest, loaded.text, tuple(part_id), tensors.state_dict)


def assert_found(results: list[Found], iteration: int, states: list[Any], what: str) -> None:
    """Every rank found `iteration` and loaded exactly states[rank], as part (iteration, rank, '')."""
    __tracebackhide__ = True
    assert_each_rank(
        "found",
        results,
        [Found(iteration, "returned", (iteration, rank, "")) for rank in range(len(results))],
        per_rank=True,
        call=what,
    )
    for rank, found in enumerate(results):
        assert_state_dict_equal(found.state_dict, states[rank], call=f"rank {rank}: load() after {what}")


def assert_nothing_found(results: list[Found], what: str) -> None:
    """Every rank found no checkpoint (-1) and load() raised CheckpointingException."""
    __tracebackhide__ = True
    assert_each_rank("found", results, Found(-1, "CheckpointingException"), call=what)


def save_values(base: str, layout: tuple[int, int] | None, iteration: int, mode: str = "sync") -> None:
    """On every rank: save rank_value(rank, iteration) with a new manager."""
    rank, _ = world()
    save(manager(base, layout), tasd(rank_value(rank, iteration)), iteration, mode)


def try_save_values(base: str, layout: tuple[int, int] | None, iteration: int, mode: str = "sync") -> str:
    """save_values, reporting "returned" or the class name of what save() raised (a bound exceeded fails)."""
    return attempt(save_values, base, layout, iteration, mode, hung_fails=True).text


def fresh_find_then_load(base: str, layout: tuple[int, int] | None) -> Found:
    """On every rank: find_then_load with a new manager."""
    return find_then_load(manager(base, layout))


def storage_bytes(base: str, rank: int) -> int:
    """Bytes in all files under rank's node-local root."""
    total = 0
    for folder, _, files in os.walk(node_root(base, rank)):
        total += sum(os.path.getsize(os.path.join(folder, name)) for name in files)
    return total


def cliques(world_size: int, jump: int, factor: int) -> list[list[int]]:
    """The spec's clique layout (001, CliqueReplicationStrategy docstring): in every block of
    jump*factor consecutive ranks starting at s, ranks s+b, s+b+jump, ..., s+b+(factor-1)*jump form
    a clique, for each b < jump."""
    block = jump * factor
    return [[start + b + k * jump for k in range(factor)] for start in range(0, world_size, block) for b in range(jump)]


PAYLOAD = 16 * 1024
"""Bytes of the payload tensor of rank_value: it dominates the size of a part."""
PART_SLACK = 8 * 1024
"""What a part may take beyond its payload (file format, pickled objects)."""


def rank_value(rank: int, iteration: int) -> dict[str, Any]:
    """A per-rank, per-iteration state dict: tensors, plain values, and a PAYLOAD-byte tensor."""
    base = 1000 * iteration + 10 * rank
    return {
        "w": torch.arange(base, base + 3, dtype=torch.int64),
        "opt": {"lr": 0.5 * rank, "steps": [iteration]},
        "tag": f"r{rank}i{iteration}",
        "half": [torch.full((2, 2), float(rank), dtype=torch.float16)],
        "payload": torch.full((PAYLOAD // 4,), float(base), dtype=torch.float32),
    }
