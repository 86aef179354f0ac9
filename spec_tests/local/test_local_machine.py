"""A state machine drives save / find_latest+load / lose-a-node on 4 ranks against a small model.

The model knows, for every rank's node-local storage, which parts (iteration, owner) it holds. A
successful save of i leaves exactly the parts of i that the layout places there (the rank's own and,
with replication, its clique members'); losing a node empties its storage and restarts every rank
process. An iteration is recoverable when every rank's part is held by a member of that rank's clique;
find_latest must return the newest recoverable iteration (or -1) and load must give back exactly what
each rank saved, and a save of an iteration not newer than that must be refused without changes.
"""

import tempfile

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (RuleBasedStateMachine, initialize, invariant, precondition, rule,
                                 run_state_machine_as_test)

from spec_tests.harness import strategies
from spec_tests.harness.asserts import assert_state_dict_equal
from spec_tests.local.common import (PART_SLACK, PAYLOAD, cliques, fresh_find_then_load, lose_nodes, rank_value,
                                     storage_bytes, try_save_values)

WORLD = 4


class LocalManagerMachine(RuleBasedStateMachine):
    pool = tmp = None

    @initialize(layout=strategies.replication_params(WORLD))
    def start(self, layout):
        self.layout, self.base = layout, tempfile.mkdtemp(dir=self.tmp)
        self.groups = [[r] for r in range(WORLD)] if layout is None else cliques(WORLD, *layout)
        self.disk = {rank: set() for rank in range(WORLD)}

    def _group(self, rank):
        return next(g for g in self.groups if rank in g)

    def latest(self) -> int:
        """The newest iteration every rank can get its own part of (from its clique), or -1."""
        held = {part for parts in self.disk.values() for part in parts}

        def recoverable(iteration):
            return all(any((iteration, owner) in self.disk[m] for m in self._group(owner)) for owner in range(WORLD))

        return max((i for i, _ in held if recoverable(i)), default=-1)

    def _save(self, iteration, mode):
        return self.pool.run(try_save_values, self.base, self.layout, iteration, mode)

    @rule(step=st.integers(1, 6), mode=st.sampled_from(["sync", "temporal"]))
    def save_newer(self, step, mode):
        iteration = self.latest() + step
        outcomes = self._save(iteration, mode)
        assert outcomes == ["saved"] * WORLD, f"save({iteration}) {mode} with latest {self.latest()}: {outcomes} [LM-2]"
        for rank in range(WORLD):
            self.disk[rank] = {(iteration, owner) for owner in self._group(rank)}

    @precondition(lambda self: self.latest() >= 0)
    @rule(back=st.integers(0, 2))
    def save_not_newer(self, back):
        iteration = max(0, self.latest() - back)
        outcomes = self._save(iteration, "sync")
        assert outcomes == ["CheckpointingException"] * WORLD, (
            f"save({iteration}) with latest {self.latest()} gave {outcomes}, but should be refused [LM-10]")

    @rule()
    def find_and_load(self):
        latest = self.latest()
        for rank, (found, outcome) in enumerate(self.pool.run(fresh_find_then_load, self.base, self.layout)):
            assert found == latest, f"rank {rank}: find_latest()={found}, model {latest}, storage {self.disk} [LM-5]"
            if latest < 0:
                assert outcome == ("raised", "CheckpointingException"), f"rank {rank}: load() gave {outcome} [LM-12]"
                continue
            assert outcome[0] == "loaded", f"rank {rank}: load() raised {outcome[1]} [LM-6]"
            assert outcome[2] == (latest, rank, ""), f"rank {rank}: part id {outcome[2]} [LM-2]"
            assert_state_dict_equal(outcome[1], rank_value(rank, latest), call=f"rank {rank}: load() [LM-6]")

    @invariant()
    def storage_holds_no_superseded_parts(self):
        if not hasattr(self, "disk"):
            return
        for rank, parts in self.disk.items():
            used = storage_bytes(self.base, rank)
            assert used <= len(parts) * (PAYLOAD + PART_SLACK), (
                f"rank {rank} stores {used} bytes, but should only hold the parts {sorted(parts)} [LM-8]")

    @rule(rank=st.integers(0, WORLD - 1))
    def lose_node(self, rank):
        lose_nodes(self.base, [rank])
        self.pool.close()  # the next rule runs on fresh rank processes
        self.disk[rank] = set()


@pytest.mark.spec("LM-2", "LM-5", "LM-6", "LM-8", "LM-10", "LM-12")
@pytest.mark.needs("local_checkpointing", "temporal_caller")
def test_the_manager_agrees_with_the_model(request, rank_pool, tmp_path):
    machine = type("Machine", (LocalManagerMachine,), dict(pool=rank_pool(WORLD), tmp=str(tmp_path)))
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if not request.node.get_closest_marker("xfail"):
        phases.append(Phase.shrink)  # a known divergence is not worth minutes of shrinking
    budget = settings(phases=phases, max_examples=max(3, settings().max_examples // 3))
    run_state_machine_as_test(machine, settings=budget)
