"""AsyncCallsQueue and the caller completion protocol: indices, order, collectives, errors, close."""

import functools
import os
import pickle
import threading

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from torch.distributed.checkpoint import CheckpointException

from spec_tests.harness import strategies, workloads
from spec_tests.harness.asserts import assert_state_dict_equal, bounded
from spec_tests.harness.ranks import ranks, world
from spec_tests.harness.processes import exists, wait_for_file
from spec_tests.harness.targets import current_target

CALLERS = [pytest.param(True, id="persistent", marks=pytest.mark.needs("persistent_caller")),
           pytest.param(False, id="temporal", marks=pytest.mark.needs("temporal_caller"))]


def _core():
    return current_target().module("async_ckpt.core")


def _request(gate=None, fail_with=None, log=None, tag=None):
    fns = [functools.partial(workloads.append_line, log, tag)] if log else []
    return _core().AsyncRequest(workloads.gated, (gate, fail_with), fns)


def _finalize(queue, blocking=True, no_dist=False, bound=60):
    return bounded(bound, f"maybe_finalize_async_calls(blocking={blocking}, no_dist={no_dist})",
                   queue.maybe_finalize_async_calls, blocking, no_dist)


def _lines(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return f.read().split()


class _CollectiveCounter:
    """Counts calls of torch.distributed.all_reduce (and the element counts) while active."""

    def __init__(self):
        self.calls, self._real = [], dist.all_reduce

    def __enter__(self):
        def counting(tensor, *args, **kwargs):
            self.calls.append(tensor.numel())
            return self._real(tensor, *args, **kwargs)

        dist.all_reduce = counting
        return self

    def __exit__(self, *exc):
        dist.all_reduce = self._real


# ------------------------------------------------------------------------ indices and order


def _indices_and_default_caller(tmp):
    queue = _core().AsyncCallsQueue()
    pids = [os.path.join(tmp, f"pid{i}") for i in range(2)]
    idx = [queue.schedule_async_request(_core().AsyncRequest(workloads.write_pid, (p,), [])) for p in pids]
    _finalize(queue)
    other = _core().AsyncCallsQueue()
    other_idx = other.schedule_async_request(_core().AsyncRequest(None, (), []))
    _finalize(other)
    other.close()
    queue.close()
    runners = {int(open(p).read()) for p in pids}
    return idx, other_idx, len(runners), os.getpid() in runners


@pytest.mark.spec("AQ-1", "AQ-2", "PC-1")
def test_default_queue_is_persistent_and_counts_from_zero(rank_pool, tmp_path):
    (idx, other_idx, n_runners, in_trainer), = rank_pool(1).run(_indices_and_default_caller, str(tmp_path))
    assert idx == [0, 1] and other_idx == 0, f"indices={idx}, second queue's first={other_idx}"
    assert n_runners == 1 and not in_trainer, (
        f"both requests should run in one worker process (not the trainer); ran in {n_runners} process(es), "
        f"trainer among them: {in_trainer}")


def _head_of_line(tmp, persistent):
    log, gate0 = os.path.join(tmp, "log"), os.path.join(tmp, "gate0")
    queue = _core().AsyncCallsQueue(persistent=persistent)
    queue.schedule_async_request(_request(gate0, log=log, tag="a"))
    queue.schedule_async_request(_request(None, log=log, tag="b"))
    early = _finalize(queue, blocking=False)
    pending = queue.get_num_unfinalized_calls()
    workloads.open_gate(gate0)
    done = _finalize(queue)
    result = early, pending, done, queue.get_num_unfinalized_calls(), _lines(log)
    queue.close()
    return result


@pytest.mark.spec("AQ-3", "AQ-5", "AQ-6")
@pytest.mark.parametrize("persistent", CALLERS)
def test_finalize_keeps_schedule_order_and_returns_what_it_finalized(rank_pool, tmp_path, persistent):
    early, pending, done, after, log = rank_pool(1).run(_head_of_line, str(tmp_path), persistent)[0]
    assert early == [] and pending == 2, f"with call 0 unfinished, finalize returned {early}, pending={pending}"
    assert done == [0, 1], f"blocking finalize returned {done}, but should be [0, 1]"
    assert after == 0 and log == ["a", "b"], f"pending after={after}, finalize order={log}"


def _finalize_after_every_rank(tmp, persistent):
    rank, size = world()
    gate, marker = os.path.join(tmp, f"gate{rank}"), os.path.join(tmp, f"done{rank}")
    seen = []

    def check_all_ranks_done():
        seen.append(sorted(f for f in os.listdir(tmp) if f.startswith("done")))

    queue = _core().AsyncCallsQueue(persistent=persistent)
    queue.schedule_async_request(_core().AsyncRequest(
        workloads.save_when_open, (gate, {"rank": rank}, marker), [check_all_ranks_done]))
    if rank == 0:
        workloads.open_gate(gate)
    first = _finalize(queue, blocking=False)  # rank 1's call cannot be done yet
    if rank == 1:
        workloads.open_gate(gate)
    second = _finalize(queue)
    queue.close()
    return first, second, seen


@pytest.mark.spec("AQ-4", "AC-2")
@pytest.mark.parametrize("persistent", CALLERS)
def test_finalize_fns_run_once_after_every_rank_finished(rank_pool, tmp_path, persistent):
    results = rank_pool(2).run(_finalize_after_every_rank, str(tmp_path), persistent)
    for rank, (first, second, seen) in enumerate(results):
        assert first == [], f"rank {rank} finalized {first} while rank 1's call was unfinished"
        assert second == [0], f"rank {rank}: blocking finalize returned {second}"
        assert seen == [["done0", "done1"]], f"rank {rank}: finalize fn ran {len(seen)} time(s), saw {seen}"


# ------------------------------------------------------------------------------- collectives


def _poll_costs(tmp, persistent):
    gate = os.path.join(tmp, f"gate{dist.get_rank()}")
    queue = _core().AsyncCallsQueue(persistent=persistent)
    queue.schedule_async_request(_request(gate))
    with _CollectiveCounter() as dist_poll:
        answer = _finalize(queue, blocking=False, no_dist=False)
    with _CollectiveCounter() as local_poll:
        _finalize(queue, blocking=False, no_dist=True)
    workloads.open_gate(gate)
    with _CollectiveCounter() as local_final:
        _finalize(queue, blocking=True, no_dist=True)
    queue.close()
    return answer, dist_poll.calls, local_poll.calls + local_final.calls


@pytest.mark.spec("AC-1", "AC-3")
@pytest.mark.parametrize("persistent", CALLERS)
def test_a_poll_is_one_single_integer_all_reduce_and_no_dist_is_none(rank_pool, tmp_path, persistent):
    for rank, (answer, dist_calls, local_calls) in enumerate(
            rank_pool(2).run(_poll_costs, str(tmp_path), persistent)):
        assert answer == [], f"rank {rank}: an unfinished call was finalized: {answer}"
        assert dist_calls == [1], f"rank {rank}: a distributed poll issued all-reduces of sizes {dist_calls}"
        assert local_calls == [], f"rank {rank}: no_dist=True issued all-reduces of sizes {local_calls}"


def _caller_answers(tmp, caller_name):
    core = _core()
    caller = getattr(core, caller_name)()
    gate = os.path.join(tmp, f"gate-{caller_name}")
    caller.schedule_async_call(core.AsyncRequest(workloads.gated, (gate, None), []).freeze())
    with _CollectiveCounter() as counter:
        answer = bounded(30, "is_current_async_call_done(blocking=False)",
                         caller.is_current_async_call_done, False, False)
    workloads.open_gate(gate)
    final = bounded(60, "is_current_async_call_done(blocking=True)", caller.is_current_async_call_done, True, False)
    caller.close()
    return type(answer).__name__, type(final).__name__, bool(answer), bool(final), counter.calls


@pytest.mark.spec("AC-1", "AC-4")
@pytest.mark.parametrize("caller_name", [
    pytest.param("PersistentAsyncCaller", marks=pytest.mark.needs("persistent_caller")),
    pytest.param("TemporalAsyncCaller", marks=pytest.mark.needs("temporal_caller"))])
def test_caller_answers_with_a_bool_after_one_all_reduce(rank_pool, tmp_path, caller_name):
    (t_answer, t_final, answer, final, calls), = rank_pool(1).run(_caller_answers, str(tmp_path), caller_name)
    assert (answer, final) == (False, True), f"answers={answer}, {final}"
    assert calls == [1], f"one non-blocking check issued all-reduces of sizes {calls}"
    assert (t_answer, t_final) == ("bool", "bool"), f"returned {t_answer} and {t_final}, but should be bool"


# ------------------------------------------------------------------------------------ errors


def _error_on_rank1(tmp, persistent, where):
    rank, _ = world()
    log = os.path.join(tmp, f"log{rank}")
    fail = f"injected failure on rank {rank}" if rank == 1 else None
    queue = _core().AsyncCallsQueue(persistent=persistent)
    if where == "async_fn":
        queue.schedule_async_request(_request(None, fail_with=fail, log=log, tag="fin"))
    else:
        fns = [functools.partial(workloads.fail, fail)] if fail else [functools.partial(workloads.append_line, log, "fin")]
        queue.schedule_async_request(_core().AsyncRequest(workloads.gated, (None, None), fns))
    try:
        _finalize(queue, bound=30)
        outcome = "returned"
    except CheckpointException as exc:
        outcome = f"CheckpointException({', '.join(map(str, sorted(exc.failures)))})"
    except Exception as exc:
        outcome = f"{type(exc).__name__}: {exc}"
    _close_quietly(queue)
    return outcome


def _close_quietly(queue):
    """Cleanup after a provoked error: bounded, and its own failure is not this test's subject."""
    try:
        bounded(30, "close()", queue.close)
    except BaseException:
        pass


@pytest.mark.spec("AQ-7")
@pytest.mark.parametrize("persistent", CALLERS)
def test_async_fn_error_on_one_rank_raises_on_every_rank(rank_pool, tmp_path, persistent):
    outcomes = rank_pool(2).run(_error_on_rank1, str(tmp_path), persistent, "async_fn")
    assert outcomes == ["CheckpointException(1)"] * 2, f"outcomes per rank: {outcomes}"


@pytest.mark.spec("AQ-8")
@pytest.mark.parametrize("persistent", CALLERS)
def test_finalize_fn_error_on_one_rank_raises_on_every_rank(rank_pool, tmp_path, persistent):
    outcomes = rank_pool(2).run(_error_on_rank1, str(tmp_path), persistent, "finalize_fn")
    assert outcomes == ["CheckpointException(1)"] * 2, f"outcomes per rank: {outcomes}"


def _failed_call_is_dropped(tmp, persistent):
    log = os.path.join(tmp, "log")
    queue = _core().AsyncCallsQueue(persistent=persistent)
    queue.schedule_async_request(_request(None, fail_with="disk full", log=log, tag="bad"))
    queue.schedule_async_request(_request(None, log=log, tag="good"))
    with pytest.raises(CheckpointException):
        _finalize(queue, bound=30)
    pending = queue.get_num_unfinalized_calls()
    again = _finalize(queue, bound=30)
    _close_quietly(queue)
    return pending, again, _lines(log)


@pytest.mark.spec("AQ-9")
@pytest.mark.parametrize("persistent", CALLERS)
def test_a_failed_call_is_dropped_and_later_calls_still_finalize(rank_pool, tmp_path, persistent):
    pending, again, log = rank_pool(1).run(_failed_call_is_dropped, str(tmp_path), persistent)[0]
    assert (pending, again, log) == (1, [1], ["good"]), (
        f"after the failure: pending={pending}, next finalize={again}, finalize fns run={log}; "
        "should be 1, [1], ['good']")


# ------------------------------------------------------------------------------------- close


def _close_finalizes(tmp, persistent):
    log = os.path.join(tmp, "log")
    queue = _core().AsyncCallsQueue(persistent=persistent)
    for tag in ("a", "b"):
        queue.schedule_async_request(_request(None, log=log, tag=tag))
    bounded(60, "close()", queue.close)
    return _lines(log), queue.get_num_unfinalized_calls()


@pytest.mark.spec("AQ-10")
@pytest.mark.parametrize("persistent", CALLERS)
def test_close_finalizes_every_pending_call(rank_pool, tmp_path, persistent):
    assert rank_pool(1).run(_close_finalizes, str(tmp_path), persistent) == [(["a", "b"], 0)]


def _abort_in_flight(tmp, persistent):
    log, pid_file = os.path.join(tmp, "log"), os.path.join(tmp, "pid")
    queue = _core().AsyncCallsQueue(persistent=persistent)
    never = os.path.join(tmp, "never-opened")
    queue.schedule_async_request(_core().AsyncRequest(
        workloads.write_pid, (pid_file, never), [functools.partial(workloads.append_line, log, "fin")]))
    wait_for_file(pid_file)
    bounded(10, "close(abort=True)", queue.close, abort=True)
    runner = int(open(pid_file).read())
    return _lines(log), exists(runner)


@pytest.mark.spec("AQ-11")
@pytest.mark.parametrize("persistent", CALLERS)
def test_abort_stops_in_flight_work_without_finalizing(rank_pool, tmp_path, persistent):
    log, runner_alive = rank_pool(1).run(_abort_in_flight, str(tmp_path), persistent)[0]
    assert log == [], f"close(abort=True) ran finalize functions: {log}"
    assert not runner_alive, ("the process running the aborted call still exists (running, or not reaped) "
                              "when close(abort=True) returns")


def _bad_input():
    queue = _core().AsyncCallsQueue(persistent=False)
    errors = []
    for bad in (object(), ("not", "a", "request")):
        try:
            queue.schedule_async_request(bad)
            errors.append(None)
        except TypeError:
            errors.append("TypeError")
    pending = queue.get_num_unfinalized_calls()
    queue.close()
    queue.close()
    try:
        queue.schedule_async_request(_core().AsyncRequest(None, (), []))
        closed = None
    except RuntimeError:
        closed = "RuntimeError"
    return errors, pending, closed


@pytest.mark.spec("AQ-12")
def test_bad_input_gets_a_clear_error(rank_pool):
    assert rank_pool(1).run(_bad_input) == [(["TypeError", "TypeError"], 0, "RuntimeError")]


def _two_queues(tmp, persistent):
    log = os.path.join(tmp, "log")
    q1, q2 = (_core().AsyncCallsQueue(persistent=persistent) for _ in range(2))
    idx = [q.schedule_async_request(_request(None, log=log, tag=f"{name}{i}"))
           for i in range(2) for name, q in (("x", q1), ("y", q2))]
    _finalize(q1)
    first = sorted(_lines(log)), q1.get_num_unfinalized_calls(), q2.get_num_unfinalized_calls()
    _finalize(q2)
    q1.close(), q2.close()
    return idx, first, sorted(_lines(log))


@pytest.mark.spec("AQ-13")
@pytest.mark.parametrize("persistent", CALLERS)
def test_two_queues_do_not_interfere(rank_pool, tmp_path, persistent):
    idx, first, log = rank_pool(1).run(_two_queues, str(tmp_path), persistent)[0]
    assert idx == [0, 0, 1, 1], f"interleaved schedules on two queues got indices {idx}"
    assert first == (["x0", "x1"], 0, 2), (
        f"after finalizing queue x only: finalize fns run, pending x, pending y = {first}")
    assert log == ["x0", "x1", "y0", "y1"], f"finalize fns run: {log}"


def _unpicklable(tmp):
    queue = _core().AsyncCallsQueue(persistent=True)
    try:
        queue.schedule_async_request(_core().AsyncRequest(workloads.gated, (threading.Lock(), None), []))
        refused = None
    except (TypeError, pickle.PicklingError):
        refused = "refused"
    log = os.path.join(tmp, "log")
    idx = queue.schedule_async_request(_request(None, log=log, tag="ok"))
    done = _finalize(queue, bound=30)
    queue.close()
    return refused, idx, done


@pytest.mark.spec("AQ-16")
@pytest.mark.needs("persistent_caller")
def test_an_unpicklable_request_is_refused_at_schedule(rank_pool, tmp_path):
    assert rank_pool(1).run(_unpicklable, str(tmp_path)) == [("refused", 0, [0])]


@pytest.mark.spec("AQ-15")
@pytest.mark.needs("no_process_group")
@pytest.mark.parametrize("persistent", CALLERS)
@ranks(1, timeout=90)
def test_works_without_a_process_group(tmp_path, persistent):
    dist.destroy_process_group()
    log = os.path.join(tmp_path, "log")
    queue = _core().AsyncCallsQueue(persistent=persistent)
    queue.schedule_async_request(_request(None, log=log, tag="a"))
    assert _finalize(queue) == [0] and _lines(log) == ["a"]
    queue.close()


# ---------------------------------------------------------------------------------- snapshot


def _snapshot(tmp, persistent, state_dict):
    gate, out = os.path.join(tmp, "gate"), os.path.join(tmp, "out.pt")
    state_dict = strategies.private_copy(state_dict)
    expected = strategies.private_copy(state_dict)
    queue = _core().AsyncCallsQueue(persistent=persistent)
    queue.schedule_async_request(_core().AsyncRequest(workloads.save_when_open, (gate, state_dict, out), []))
    strategies.mutate_in_place(state_dict)  # the next training step, while the write waits
    workloads.open_gate(gate)
    _finalize(queue)
    queue.close()
    assert_state_dict_equal(torch.load(out, weights_only=False), expected,
                            call="data saved by an async call scheduled before an in-place update")
    os.remove(gate), os.remove(out)


@pytest.mark.spec("AQ-14")
@pytest.mark.parametrize("persistent", CALLERS)
@given(state_dict=strategies.state_dicts())
def test_async_fn_sees_the_data_as_scheduled(rank_pool, tmp_path_factory, persistent, state_dict):
    rank_pool(1).run(_snapshot, str(tmp_path_factory.mktemp("snap")), persistent, state_dict)
