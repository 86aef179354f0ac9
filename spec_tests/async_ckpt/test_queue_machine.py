"""A state machine drives a queue on 1 or 2 ranks against a small independent model.

Rules interleave schedule (some calls fail on the last rank), opening a call's gate (letting its async_fn
finish), non-blocking polls, blocking finalizes and close. The model knows which calls may be finalized:
a poll may return any prefix of the pending calls whose gates are open (completion is asynchronous), a
blocking finalize must return all of them up to the first failed call, and every rank must agree.
"""

import functools
import os
import tempfile

import pytest
from hypothesis import Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule, run_state_machine_as_test
from torch.distributed.checkpoint import CheckpointException

from spec_tests.harness import workloads
from spec_tests.harness.asserts import bounded
from spec_tests.harness.ranks import rank_state, world
from spec_tests.harness.targets import current_target

# ------------------------------------------------------------------- what runs on every rank


def _open_queue(persistent):
    old = rank_state.pop("queue", None)
    if old is not None:
        try:
            bounded(60, "close() of the previous example's queue", old.close)
        except CheckpointException:
            pass  # the previous example left a failed call behind; that example checked it
    rank_state.update(queue=current_target().module("async_ckpt.core").AsyncCallsQueue(persistent=persistent),
                      log=[])


def _schedule(gate, k, fail):
    rank, size = world()
    core = current_target().module("async_ckpt.core")
    fail_with = f"call {k} fails on rank {rank}" if fail and rank == size - 1 else None
    request = core.AsyncRequest(workloads.gated, (gate, fail_with), [functools.partial(rank_state["log"].append, k)])
    return rank_state["queue"].schedule_async_request(request)


def _finalize(blocking, no_dist):
    queue, log = rank_state["queue"], rank_state["log"]
    before = len(log)
    try:
        outcome = ("ok", bounded(60, "maybe_finalize_async_calls", queue.maybe_finalize_async_calls, blocking, no_dist))
    except CheckpointException:
        outcome = ("raised", None)
    return outcome, log[before:], queue.get_num_unfinalized_calls()


def _close():
    queue, log = rank_state["queue"], rank_state["log"]
    before = len(log)
    bounded(60, "close()", queue.close)
    try:
        queue.schedule_async_request(current_target().module("async_ckpt.core").AsyncRequest(None, (), []))
        after_close = "scheduled"
    except RuntimeError:
        after_close = "RuntimeError"
    return log[before:], after_close


def _pending():
    return rank_state["queue"].get_num_unfinalized_calls()


# --------------------------------------------------------------------------- the machine


class QueueMachine(RuleBasedStateMachine):
    """Model: `pending` is a list of [k, index, gate_open, fails]; `closed` after close()."""

    pool = world_size = persistent = tmp = None

    def __init__(self):
        super().__init__()
        self.pending, self.next_index, self.k, self.closed = [], 0, 0, False
        self.closed_gates = []  # depends on the rules drawn only, never on timing: safe for preconditions
        self.gates = tempfile.mkdtemp(dir=self.tmp)
        self.pool.run(_open_queue, self.persistent)

    def _gate(self, k):
        return os.path.join(self.gates, f"gate{k}")

    def _agree(self, results):
        assert all(r == results[0] for r in results), f"ranks disagree: {results}"
        return results[0]

    @precondition(lambda self: not self.closed)
    @rule(fails=st.booleans())
    def schedule(self, fails):
        self.k += 1
        gate = self._gate(self.k)
        index = self._agree(self.pool.run(_schedule, gate, self.k, fails))
        assert index == self.next_index, f"schedule returned {index}, but should be {self.next_index} [AQ-2]"
        self.pending.append([self.k, index, False, fails])
        self.closed_gates.append(self.k)
        self.next_index += 1

    @precondition(lambda self: self.closed_gates)
    @rule(data=st.data())
    def open_gate(self, data):
        self._open(data.draw(st.sampled_from(self.closed_gates), label="call whose async_fn may finish"))

    def _open(self, k):
        workloads.open_gate(self._gate(k))
        self.closed_gates.remove(k)
        for call in self.pending:
            call[2] = call[2] or call[0] == k

    def _open_all(self):
        for k in list(self.closed_gates):
            self._open(k)

    def _check_finalized(self, outcome, log, count, exact):
        kind, indices = outcome
        finishable = []
        for call in self.pending:
            if not call[2]:
                break
            finishable.append(call)
        ok = [c for c in finishable[: next((i for i, c in enumerate(finishable) if c[3]), len(finishable))]]
        n = len(log)
        assert log == [c[0] for c in self.pending[:n]], f"finalize fns ran for {log}; pending calls {self.pending}"
        assert n <= len(ok), f"finalized {log}, but only {[c[0] for c in ok]} could be [AQ-4]"
        if kind == "raised":
            assert n < len(finishable) and finishable[n][3], f"raised, but call after {log} did not fail [AQ-7]"
            del self.pending[: n + 1]
        else:
            assert indices == [c[1] for c in self.pending[:n]], f"returned {indices} for calls {log} [AQ-3]"
            if exact:
                assert n == len(ok), f"a blocking finalize left {[c[0] for c in ok[n:]]} pending [AQ-5]"
            del self.pending[:n]
        assert count == len(self.pending), f"get_num_unfinalized_calls()={count}, model {len(self.pending)} [AQ-6]"

    @rule()
    def poll(self):
        self._check_finalized(*self._agree(self.pool.run(_finalize, False, False)), exact=False)

    @rule(no_dist=st.booleans())
    def finalize_blocking(self, no_dist):
        self._open_all()
        if no_dist and self.world_size > 1 and any(p[3] for p in self.pending):
            no_dist = False  # with no_dist only the failing rank would know: ranks would diverge
        self._check_finalized(*self._agree(self.pool.run(_finalize, True, no_dist)), exact=True)

    @precondition(lambda self: not self.closed)
    @rule()
    def close(self):
        self._open_all()
        while any(p[3] for p in self.pending):  # failed calls first: close() would raise on them
            self._check_finalized(*self._agree(self.pool.run(_finalize, True, False)), exact=True)
        log, after_close = self._agree(self.pool.run(_close))
        assert log == [p[0] for p in self.pending], f"close() finalized {log}, pending {self.pending} [AQ-10]"
        assert after_close == "RuntimeError", f"schedule after close: {after_close} [AQ-12]"
        self.pending, self.closed = [], True

    @invariant()
    def counts_agree(self):
        if not self.closed:
            counts = self.pool.run(_pending)
            assert counts == [len(self.pending)] * self.world_size, f"pending per rank {counts} [AQ-6]"

    def teardown(self):
        self._open_all()


@pytest.mark.spec("AQ-2", "AQ-3", "AQ-4", "AQ-5", "AQ-6", "AQ-7", "AQ-9", "AQ-10", "AQ-12", "AC-2")
@pytest.mark.parametrize("persistent", [
    pytest.param(True, id="persistent", marks=pytest.mark.needs("persistent_caller")),
    pytest.param(False, id="temporal", marks=pytest.mark.needs("temporal_caller"))])
@pytest.mark.parametrize("world_size", [1, 2])
def test_queue_agrees_with_the_model(request, rank_pool, tmp_path, persistent, world_size):
    machine = type("Machine", (QueueMachine,), dict(
        pool=rank_pool(world_size), world_size=world_size, persistent=persistent, tmp=str(tmp_path)))
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if not request.node.get_closest_marker("xfail"):
        phases.append(Phase.shrink)  # a known divergence is not worth minutes of shrinking
    # Each example starts a queue (and a worker process): fewer, longer examples than the profile's.
    budget = settings(phases=phases, max_examples=max(3, settings().max_examples // 3))
    run_state_machine_as_test(machine, settings=budget)
