"""A state machine drives a queue on 1 or 2 ranks against a small independent model.

Rules interleave schedule (some calls fail on the last rank), opening a call's gate (letting its async_fn
finish), non-blocking polls, blocking finalizes and close. The model knows which calls may be finalized:
a poll may return any prefix of the pending calls whose gates are open (completion is asynchronous), a
blocking finalize must return all of them up to the first failed call, and every rank must agree.
"""

import contextlib
import functools
import os
import tempfile
from dataclasses import dataclass, field

import pytest
from hypothesis import note
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule
from torch.distributed.checkpoint import CheckpointException

from ckptspec.spec.harness import workloads
from ckptspec.spec.harness.asserts import attempt, bounded
from ckptspec.spec.harness.machines import agreed, run_machine
from ckptspec.spec.harness.processes import CALLERS, async_core
from ckptspec.spec.harness.ranks import rank_state, world

# ------------------------------------------------------------------- what runs on every rank


@dataclass(frozen=True)
class Finalized:
    """What maybe_finalize_async_calls did on a rank."""

    outcome: str  # "returned" or the class name of what it raised
    indices: list | None  # what it returned
    finalize_fns_run: list  # the k of every call whose finalize function ran meanwhile
    pending: int  # get_num_unfinalized_calls() afterwards


@dataclass(frozen=True)
class CloseSeen:
    finalize_fns_run: list
    schedule_after_close: str  # "returned" or the class name of what it raised


def _open_queue(persistent):
    old = rank_state.pop("queue", None)
    if old is not None:
        with contextlib.suppress(CheckpointException):  # a failed call the previous example left behind checked it
            bounded(60, "close() of the previous example's queue", old.close)
    rank_state.update(queue=async_core().AsyncCallsQueue(persistent=persistent), log=[])


def _schedule(gate, k, fail):
    rank, size = world()
    fail_with = f"call {k} fails on rank {rank}" if fail and rank == size - 1 else None
    request = async_core().AsyncRequest(
        workloads.gated, (gate, fail_with), [functools.partial(rank_state["log"].append, k)]
    )
    return rank_state["queue"].schedule_async_request(request)


def _finalize(blocking, no_dist):
    queue, log = rank_state["queue"], rank_state["log"]
    before = len(log)
    done = attempt(
        queue.maybe_finalize_async_calls,
        blocking,
        no_dist,
        bound=60,
        hung_fails=True,
        what=f"maybe_finalize_async_calls(blocking={blocking}, no_dist={no_dist})",
    )
    if not done.returned and done.text != "CheckpointException":
        assert done.error is not None  # a call that did not return raised (hung_fails: a hang raises at once)
        raise done.error
    return Finalized(done.text, done.value, log[before:], queue.get_num_unfinalized_calls())


def _close():
    queue, log = rank_state["queue"], rank_state["log"]
    before = len(log)
    bounded(60, "close()", queue.close)
    after = attempt(queue.schedule_async_request, async_core().AsyncRequest(None, (), [])).text
    return CloseSeen(log[before:], after)


def _pending():
    return rank_state["queue"].get_num_unfinalized_calls()


# --------------------------------------------------------------------------- the machine


@dataclass
class Call:
    """A scheduled call the model expects pending."""

    k: int  # the machine's number for it (its finalize function logs k)
    index: int  # what schedule_async_request returned
    fails: bool  # its async_fn fails on the last rank
    gate_open: bool = False  # its async_fn may finish


@dataclass
class QueueModel:
    pending: list[Call] = field(default_factory=list)
    next_index: int = 0
    scheduled: int = 0
    closed: bool = False
    closed_gates: list[int] = field(default_factory=list)  # rule-driven only, never timing: safe in preconditions

    def finishable(self) -> list[Call]:
        """The pending calls, from the oldest, whose gates are open."""
        calls = []
        for call in self.pending:
            if not call.gate_open:
                break
            calls.append(call)
        return calls

    def finalizable(self) -> list[Call]:
        """The finishable calls before the first failed one: what a blocking finalize must return."""
        calls = self.finishable()
        return calls[: next((i for i, c in enumerate(calls) if c.fails), len(calls))]


class QueueMachine(RuleBasedStateMachine):
    def __init__(self, pool, world_size: int, persistent: bool, tmp: str):
        super().__init__()
        self.pool, self.world_size = pool, world_size
        self.model = QueueModel()
        self.gates = tempfile.mkdtemp(dir=tmp)
        self.pool.run(_open_queue, persistent)

    def _gate(self, k):
        return os.path.join(self.gates, f"gate{k}")

    @precondition(lambda self: not self.model.closed)
    @rule(fails=st.booleans())
    def schedule(self, fails):
        model = self.model
        model.scheduled += 1
        k = model.scheduled
        index = agreed("schedule_async_request()", self.pool.run(_schedule, self._gate(k), k, fails))
        note(f"schedule call {k}{' (fails on the last rank)' if fails else ''}: index {index}")
        assert index == model.next_index, f"schedule_async_request()={index}, but should be {model.next_index} [AQ-2]"
        model.pending.append(Call(k, index, fails))
        model.closed_gates.append(k)
        model.next_index += 1

    @precondition(lambda self: self.model.closed_gates)
    @rule(data=st.data())
    def open_gate(self, data):
        k = data.draw(st.sampled_from(self.model.closed_gates), label="call whose async_fn may finish")
        note(f"open the gate of call {k}")
        self._open(k)

    def _open(self, k):
        workloads.open_gate(self._gate(k))
        self.model.closed_gates.remove(k)
        for call in self.model.pending:
            if call.k == k:
                call.gate_open = True

    def _open_all(self):
        for k in list(self.model.closed_gates):
            self._open(k)

    def _check_finalized(self, done: Finalized, exact: bool):
        model = self.model
        finishable, ok = model.finishable(), model.finalizable()
        n = len(done.finalize_fns_run)
        assert done.finalize_fns_run == [c.k for c in model.pending[:n]], (
            f"finalize fns ran for calls {done.finalize_fns_run}, but pending are {[c.k for c in model.pending]}"
        )
        assert n <= len(ok), f"finalized calls {done.finalize_fns_run}, but only {[c.k for c in ok]} could be [AQ-4]"
        if done.outcome == "CheckpointException":
            assert n < len(finishable), f"raised, but the call after {done.finalize_fns_run} did not fail [AQ-7]"
            assert finishable[n].fails, f"raised, but the call after {done.finalize_fns_run} did not fail [AQ-7]"
            del model.pending[: n + 1]
        else:
            want = [c.index for c in model.pending[:n]]
            assert done.indices == want, f"maybe_finalize_async_calls()={done.indices}, but should be {want} [AQ-3]"
            if exact:
                assert n == len(ok), f"a blocking finalize left calls {[c.k for c in ok[n:]]} pending [AQ-5]"
            del model.pending[:n]
        assert done.pending == len(model.pending), (
            f"get_num_unfinalized_calls()={done.pending}, but should be {len(model.pending)} [AQ-6]"
        )

    def _finalize(self, blocking, no_dist, exact):
        done = agreed("maybe_finalize_async_calls()", self.pool.run(_finalize, blocking, no_dist))
        note(
            f"finalize(blocking={blocking}, no_dist={no_dist}): {done.outcome} {done.indices}, "
            f"finalize fns of calls {done.finalize_fns_run}, {done.pending} pending"
        )
        self._check_finalized(done, exact)

    @rule()
    def poll(self):
        self._finalize(False, False, exact=False)

    @rule(no_dist=st.booleans())
    def finalize_blocking(self, no_dist):
        self._open_all()
        if no_dist and self.world_size > 1 and any(c.fails for c in self.model.pending):
            no_dist = False  # with no_dist only the failing rank would know: ranks would diverge
        self._finalize(True, no_dist, exact=True)

    @precondition(lambda self: not self.model.closed)
    @rule()
    def close(self):
        self._open_all()
        while any(c.fails for c in self.model.pending):  # failed calls first: close() would raise on them
            self._finalize(True, False, exact=True)
        closed = agreed("close()", self.pool.run(_close))
        note(f"close(): finalize fns of calls {closed.finalize_fns_run}; then schedule: {closed.schedule_after_close}")
        want = [c.k for c in self.model.pending]
        assert closed.finalize_fns_run == want, (
            f"close() finalized calls {closed.finalize_fns_run}, but should finalize {want} [AQ-10]"
        )
        assert closed.schedule_after_close == "RuntimeError", (
            f"schedule_async_request() after close()={closed.schedule_after_close}, but should be RuntimeError [AQ-12]"
        )
        self.model.pending, self.model.closed = [], True

    @invariant()
    def counts_agree(self):
        if not self.model.closed:
            counts = self.pool.run(_pending)
            want = [len(self.model.pending)] * self.world_size
            assert counts == want, f"get_num_unfinalized_calls() per rank={counts}, but should be {want} [AQ-6]"

    def teardown(self):
        self._open_all()


@pytest.mark.spec("AQ-2", "AQ-3", "AQ-4", "AQ-5", "AQ-6", "AQ-7", "AQ-9", "AQ-10", "AQ-12", "AC-2")
@pytest.mark.parametrize("persistent", CALLERS)
@pytest.mark.parametrize("world_size", [1, 2])
def test_queue_agrees_with_the_model(request, rank_pool, tmp_path, persistent, world_size):
    run_machine(request, lambda: QueueMachine(rank_pool(world_size), world_size, persistent, str(tmp_path)))
