"""A state machine drives save / find_latest+load / lose-a-node on 4 ranks against a small model.

The model knows, for every rank's node-local storage, which parts (iteration, owner) it holds. A
successful save of i leaves exactly the parts of i that the layout places there (the rank's own and,
with replication, its clique members'); losing a node empties its storage and restarts every rank
process. An iteration is recoverable when every rank's part is held by a member of that rank's clique;
find_latest must return the newest recoverable iteration (or -1) and load must give back exactly what
each rank saved, and a save of an iteration not newer than that must be refused without changes.
"""

import tempfile
from dataclasses import dataclass, field
from typing import NamedTuple

import pytest
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from ckptspec.spec.drivers.local import (
    PART_SLACK,
    PAYLOAD,
    assert_found,
    assert_nothing_found,
    cliques,
    fresh_find_then_load,
    lose_nodes,
    rank_value,
    storage_bytes,
    try_save_values,
)
from ckptspec.spec.harness import strategies
from ckptspec.spec.harness.asserts import assert_each_rank
from ckptspec.spec.harness.machines import run_machine

WORLD = 4


class Part(NamedTuple):
    iteration: int
    owner: int  # the rank that saved it


@dataclass
class StorageModel:
    """What every rank's node-local storage holds, under one replication layout."""

    layout: tuple | None  # (jump, factor), None: no replication
    groups: list[list[int]]  # the cliques (a rank alone without replication)
    disk: dict[int, set[Part]] = field(default_factory=lambda: {rank: set() for rank in range(WORLD)})

    def group(self, rank: int) -> list[int]:
        return next(g for g in self.groups if rank in g)

    def latest(self) -> int:
        """The newest iteration every rank can get its own part of (from its clique), or -1."""
        held = {part.iteration for parts in self.disk.values() for part in parts}

        def recoverable(iteration):
            return all(any(Part(iteration, owner) in self.disk[m] for m in self.group(owner)) for owner in range(WORLD))

        return max((i for i in held if recoverable(i)), default=-1)

    def saved(self, iteration: int) -> None:
        for rank in range(WORLD):
            self.disk[rank] = {Part(iteration, owner) for owner in self.group(rank)}


class LocalManagerMachine(RuleBasedStateMachine):
    def __init__(self, pool, tmp: str):
        super().__init__()
        self.pool, self.tmp = pool, tmp
        self.model: StorageModel | None = None
        self.base = ""

    @property
    def started(self) -> StorageModel:
        """The model, made by the initialize rule (hypothesis runs it before any other rule)."""
        assert self.model is not None
        return self.model

    @initialize(layout=strategies.replication_params(WORLD))
    def start(self, layout):
        self.base = tempfile.mkdtemp(dir=self.tmp)
        groups = [[r] for r in range(WORLD)] if layout is None else cliques(WORLD, *layout)
        self.model = StorageModel(layout, groups)
        note(f"layout (jump, factor)={layout}: cliques {groups}")
        # Start from one complete checkpoint, so that every rule (saving an older iteration too) is reachable from
        # the first step of a short, derandomized run; an empty start is LM-1's own test.
        self.save_newer(step=1, mode="sync")

    def _save(self, iteration, mode):
        return self.pool.run(try_save_values, self.base, self.started.layout, iteration, mode)

    @rule(step=st.integers(1, 6), mode=st.sampled_from(["sync", "temporal"]))
    def save_newer(self, step, mode):
        iteration = self.started.latest() + step
        outcomes = self._save(iteration, mode)
        note(f"save({iteration}) {mode}: {outcomes}")
        assert_each_rank(
            "save()", outcomes, "returned", call=f"save({iteration}) {mode}, latest {self.started.latest()} [LM-2]"
        )
        self.started.saved(iteration)

    @precondition(lambda self: self.model is not None and self.model.latest() >= 0)
    @rule(back=st.integers(0, 2))
    def save_not_newer(self, back):
        iteration = max(0, self.started.latest() - back)
        outcomes = self._save(iteration, "sync")
        note(f"save({iteration}) with latest {self.started.latest()}: {outcomes}")
        assert_each_rank(
            "save()",
            outcomes,
            "CheckpointingException",
            call=f"save({iteration}), not newer than latest {self.started.latest()} [LM-10]",
        )

    @rule()
    def find_and_load(self):
        latest = self.started.latest()
        results = self.pool.run(fresh_find_then_load, self.base, self.started.layout)
        note(f"find_latest(), load() on fresh managers (model: latest {latest}): {results}")
        what = f"storage {self.started.disk}, model's latest {latest} [LM-5, LM-6, LM-12]"
        if latest < 0:
            assert_nothing_found(results, what)
        else:
            assert_found(results, latest, [rank_value(rank, latest) for rank in range(WORLD)], what)

    @invariant()
    def storage_holds_no_superseded_parts(self):
        if self.model is None:
            return
        for rank, parts in self.model.disk.items():
            used = storage_bytes(self.base, rank)
            assert used <= len(parts) * (PAYLOAD + PART_SLACK), (
                f"rank {rank} stores {used} bytes, but should only hold the parts {sorted(parts)} [LM-8]"
            )

    @rule(rank=st.integers(0, WORLD - 1))
    def lose_node(self, rank):
        note(f"lose node {rank} (its storage), restart every rank")
        lose_nodes(self.base, [rank])
        self.pool.close()  # the next rule runs on fresh rank processes
        self.started.disk[rank] = set()


@pytest.mark.spec("LM-2", "LM-5", "LM-6", "LM-8", "LM-10", "LM-12")
@pytest.mark.needs("local_checkpointing", "temporal_caller")
def test_the_manager_agrees_with_the_model(request, rank_pool, tmp_path):
    run_machine(request, lambda: LocalManagerMachine(rank_pool(WORLD), str(tmp_path)))
