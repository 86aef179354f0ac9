"""AsyncCallsQueue and the caller completion protocol: indices, order, collectives, errors, close."""

import os

import pytest
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException

from ckptspec.spec.async_ckpt.collective_counter import CollectiveCounter
from ckptspec.spec.async_ckpt.queue_calls import (
    FINALIZE_BOUND,
    default_queue,
    descriptors_left_by_an_abort,
    finalize_queue,
    head_of_line,
    lines,
    request,
)
from ckptspec.spec.async_ckpt.queue_results import (
    Aborted,
    BadInput,
    CallerAnswers,
    Closed,
    DefaultQueue,
    EveryRankFinished,
    FailedCallDropped,
    PollCosts,
    Unpicklable,
)
from ckptspec.spec.async_ckpt.queue_runs import (
    dropped_in_flight,
    ended_in_flight,
    every_rank_finished,
    failed_call_dropped,
    unpicklable,
)
from ckptspec.spec.harness import strategies, workloads
from ckptspec.spec.harness.asserts import assert_each_rank, assert_equal, assert_state_dict_equal, attempt, bounded
from ckptspec.spec.harness.processes import (
    CALLER_CLASSES,
    CALLERS,
    STARTUP_BOUND,
    async_core,
    close_quietly,
    remove,
)
from ckptspec.spec.harness.ranks import devices, ranks, world
from ckptspec.spec.harness.warm_savers import examples_on_warm_ranks, kept

# ------------------------------------------------------------------------ indices and order


@pytest.mark.spec("AQ-1", "AQ-2", "PC-1")
def test_default_queue_is_persistent_and_counts_from_zero(rank_pool, tmp_path):
    assert_equal(
        "default queue",
        # The worker's start (up to STARTUP_BOUND) is not the subject; the finalize of the calls that ran is.
        rank_pool(1).run(default_queue, str(tmp_path), timeout=STARTUP_BOUND + FINALIZE_BOUND)[0],
        DefaultQueue(indices=[0, 1], second_queue_first_index=0, worker_processes=1, ran_in_trainer=False),
        call="two requests on AsyncCallsQueue(), one on a second queue",
    )


@pytest.mark.spec("AQ-3")
@pytest.mark.parametrize("persistent", CALLERS)
def test_finalize_keeps_schedule_order_and_returns_what_it_finalized(rank_pool, tmp_path, persistent):
    # The expected indices follow from whose finalize functions each step ran, so that this test judges only
    # the returned indices (which calls each step finalizes is AQ-5's matter, the counts AQ-6's).
    seen = rank_pool(1).run(head_of_line, str(tmp_path), persistent)[0]

    def indices_of(tags):
        return [seen.scheduled[tag] for tag in ("a", "b") if tag in tags]

    assert_equal(
        "returned",
        {"poll": seen.poll_returned, "blocking": seen.blocking_returned},
        {"poll": indices_of(seen.fns_run_by_poll), "blocking": indices_of(seen.fns_run_by_blocking)},
        call="calls a (held by its gate), b; poll; open a's gate; blocking finalize",
    )


@pytest.mark.spec("AQ-4", "AC-2")
@pytest.mark.parametrize("persistent", CALLERS)
def test_finalize_fns_run_once_after_every_rank_finished(rank_pool, tmp_path_factory, persistent):
    assert_each_rank(
        "queue",
        every_rank_finished(rank_pool, tmp_path_factory, persistent),
        EveryRankFinished(poll_with_rank1_unfinished=[], blocking_finalize=[0], finalize_fn_saw=[["done0", "done1"]]),
        call=EVERY_RANK,
    )


EVERY_RANK = "one call per rank, rank 1's held by its gate during the poll"


@pytest.mark.spec("AQ-4w")
@pytest.mark.parametrize("persistent", CALLERS)
def test_finalize_fns_run_once_after_their_own_ranks_call(rank_pool, tmp_path_factory, persistent):
    for rank, got in enumerate(every_rank_finished(rank_pool, tmp_path_factory, persistent)):
        finalized = got.poll_with_rank1_unfinished + got.blocking_finalize
        assert finalized == [0], (
            f"rank {rank} finalized {finalized} over the poll and the blocking finalize [{EVERY_RANK}]"
        )
        runs = got.finalize_fn_saw
        assert len(runs) == 1, f"rank {rank}: the call's finalize function ran {len(runs)} times [{EVERY_RANK}]"
        assert f"done{rank}" in runs[0], (
            f"rank {rank}: the finalize function ran before the rank's own call had finished (it saw {runs[0]}) "
            f"[{EVERY_RANK}]"
        )


# ------------------------------------------------------------------------------- collectives


def _poll_costs(tmp, persistent):
    gate = os.path.join(tmp, f"gate{dist.get_rank()}")
    queue = async_core().AsyncCallsQueue(persistent=persistent)
    queue.schedule_async_request(request(gate))
    with CollectiveCounter() as dist_poll:
        answer = finalize_queue(queue, blocking=False, no_dist=False)
    with CollectiveCounter() as local_poll:
        finalize_queue(queue, blocking=False, no_dist=True)
    workloads.open_gate(gate)
    with CollectiveCounter() as local_final:
        finalize_queue(queue, blocking=True, no_dist=True)
    queue.close()
    return PollCosts(answer, dist_poll.calls, local_poll.calls + local_final.calls)


@pytest.mark.spec("AC-1", "AC-3")
@pytest.mark.parametrize("persistent", CALLERS)
def test_a_poll_is_one_single_integer_all_reduce_and_no_dist_is_none(rank_pool, tmp_path, persistent):
    assert_each_rank(
        "queue",
        rank_pool(2).run(_poll_costs, str(tmp_path), persistent),
        PollCosts(poll=[], distributed_poll_all_reduces=[1], no_dist_all_reduces=[]),
        call="maybe_finalize_async_calls with a call held by its gate, then released",
    )


def _caller_answers(tmp, caller_name):
    core = async_core()
    caller = getattr(core, caller_name)()
    gate = os.path.join(tmp, f"gate-{caller_name}")
    caller.schedule_async_call(core.AsyncRequest(workloads.gated, (gate, None), []).freeze())
    with CollectiveCounter() as counter:
        answer = bounded(
            30, "is_current_async_call_done(blocking=False)", caller.is_current_async_call_done, False, False
        )
    workloads.open_gate(gate)
    final = bounded(60, "is_current_async_call_done(blocking=True)", caller.is_current_async_call_done, True, False)
    caller.close()
    return CallerAnswers(bool(answer), bool(final), type(answer).__name__, type(final).__name__, counter.calls)


@pytest.mark.spec("AC-1", "AC-4")
@pytest.mark.parametrize("caller_name", CALLER_CLASSES)
def test_caller_answers_with_a_bool_after_one_all_reduce(rank_pool, tmp_path, caller_name):
    assert_equal(
        caller_name,
        rank_pool(1).run(_caller_answers, str(tmp_path), caller_name)[0],
        CallerAnswers(poll=False, blocking=True, poll_type="bool", blocking_type="bool", poll_all_reduces=[1]),
        call="is_current_async_call_done with the call held, then released",
    )


def _sync_answers(caller_name):
    """What sync_all_async_calls answered on this rank for each (rank 0's, rank 1's) is_alive."""
    rank, _ = world()
    caller = getattr(async_core(), caller_name)()
    try:
        return {
            flags: bool(bounded(30, "sync_all_async_calls(is_alive)", caller.sync_all_async_calls, flags[rank]))
            for flags in ((0, 0), (1, 0), (0, 1), (1, 1))
        }
    finally:
        caller.close()


@pytest.mark.spec("AC-5")
@pytest.mark.parametrize("caller_name", CALLER_CLASSES)
def test_sync_all_async_calls_is_true_only_when_no_rank_is_alive(rank_pool, caller_name):
    expected = {(0, 0): True, (1, 0): False, (0, 1): False, (1, 1): False}
    assert_each_rank(
        f"{caller_name}.sync_all_async_calls",
        rank_pool(2).run(_sync_answers, caller_name),
        expected,
        call="on 2 ranks, for each pair of is_alive flags",
    )


# ------------------------------------------------------------------------------------ errors


def _error_on_rank1(tmp, persistent, where):
    rank, _ = world()
    core = async_core()
    queue = core.AsyncCallsQueue(persistent=persistent)
    queue.schedule_async_request(workloads.failing_on_rank1(core, rank, os.path.join(tmp, f"log{rank}"), where))
    outcome = attempt(queue.maybe_finalize_async_calls, True, False, bound=30, what="blocking finalize")
    close_quietly(queue)
    if isinstance(outcome.error, CheckpointException):  # outcome.text == "CheckpointException"
        return f"CheckpointException({', '.join(map(str, sorted(outcome.error.failures)))})"
    return str(outcome)


@pytest.mark.spec("AQ-7")
@pytest.mark.parametrize("persistent", CALLERS)
def test_async_fn_error_on_one_rank_raises_on_every_rank(rank_pool, tmp_path, persistent):
    assert_each_rank(
        "finalize",
        rank_pool(2).run(_error_on_rank1, str(tmp_path), persistent, "async_fn"),
        "CheckpointException(1)",
        call="blocking finalize of a call whose async_fn fails on rank 1",
    )


@pytest.mark.spec("AQ-8")
@pytest.mark.parametrize("persistent", CALLERS)
def test_finalize_fn_error_on_one_rank_raises_on_every_rank(rank_pool, tmp_path, persistent):
    assert_each_rank(
        "finalize",
        rank_pool(2).run(_error_on_rank1, str(tmp_path), persistent, "finalize_fn"),
        "CheckpointException(1)",
        call="blocking finalize of a call whose finalize fn fails on rank 1",
    )


@pytest.mark.spec("AQ-9")
@pytest.mark.parametrize("persistent", CALLERS)
def test_a_failed_call_is_dropped_and_later_calls_still_finalize(rank_pool, tmp_path_factory, persistent):
    assert_equal(
        "queue",
        failed_call_dropped(rank_pool, tmp_path_factory, persistent),
        FailedCallDropped(
            first_finalize="CheckpointException", pending_after_it=1, next_finalize=[1], finalize_fns_run=["good"]
        ),
        call=BAD_THEN_GOOD,
    )


BAD_THEN_GOOD = "calls bad (its async_fn fails) and good; finalize; finalize again"


@pytest.mark.spec("AQ-9w")
@pytest.mark.parametrize("persistent", CALLERS)
def test_a_failed_call_does_not_lose_the_next_one(rank_pool, tmp_path_factory, persistent):
    ran = failed_call_dropped(rank_pool, tmp_path_factory, persistent).finalize_fns_run
    assert ran.count("good") == 1, (
        f"the later call's finalize functions ran {ran.count('good')} times [{BAD_THEN_GOOD}]"
    )


# ------------------------------------------------------------------------------------- close


def _close_finalizes(tmp, persistent):
    log = os.path.join(tmp, "log")
    queue = async_core().AsyncCallsQueue(persistent=persistent)
    for tag in ("a", "b"):
        queue.schedule_async_request(request(None, log=log, tag=tag))
    bounded(60, "close()", queue.close)
    return Closed(lines(log), queue.get_num_unfinalized_calls())


@pytest.mark.spec("AQ-10")
@pytest.mark.parametrize("persistent", CALLERS)
def test_close_finalizes_every_pending_call(rank_pool, tmp_path, persistent):
    assert_equal(
        "queue",
        rank_pool(1).run(_close_finalizes, str(tmp_path), persistent)[0],
        Closed(finalize_fns_run=["a", "b"], pending=0),
        call="calls a and b pending; close()",
    )


@pytest.mark.spec("AQ-11")
@pytest.mark.parametrize("persistent", CALLERS)
def test_abort_stops_in_flight_work_without_finalizing(rank_pool, tmp_path, persistent):
    assert_equal(
        "queue",
        rank_pool(1).run(ended_in_flight, str(tmp_path), persistent, "abort")[0],
        Aborted(finalize_fns_run=[], runner_exists=False),
        call="close(abort=True) returned while a call was in flight",
    )


@pytest.mark.spec("PC-6")
def test_an_abort_leaves_no_descriptor_open(rank_pool, tmp_path):
    left = rank_pool(1).run(descriptors_left_by_an_abort, str(tmp_path))[0]
    assert left == 0, f"close(abort=True) with a call in flight left {left} more file descriptor(s) open in the trainer"


@pytest.mark.spec("AQ-17")
@pytest.mark.parametrize("persistent", CALLERS)
def test_a_queue_dropped_with_a_call_in_flight_aborts_it(rank_pool, tmp_path_factory, persistent):
    assert_equal(
        "queue",
        dropped_in_flight(rank_pool, tmp_path_factory, persistent),
        Aborted(finalize_fns_run=[], runner_exists=False),
        call="the last reference to a queue dropped (no close()) while a call was in flight",
    )


@pytest.mark.spec("AQ-17w")
@pytest.mark.parametrize("persistent", CALLERS)
def test_a_queue_dropped_with_a_call_in_flight_is_collected_in_time(rank_pool, tmp_path_factory, persistent):
    # The run fails (BoundExceeded) where the collection did not return within 10 s: what it did to the call
    # (finalized, aborted, left running) is AQ-17's matter.
    dropped_in_flight(rank_pool, tmp_path_factory, persistent)


def _bad_input():
    core = async_core()
    queue = core.AsyncCallsQueue(persistent=False)
    errors = [attempt(queue.schedule_async_request, bad).text for bad in (object(), ("not", "a", "request"))]
    pending = queue.get_num_unfinalized_calls()
    bounded(60, "close()", queue.close)
    return BadInput(errors, pending, attempt(queue.close, bound=60, what="close() a second time").text)


@pytest.mark.spec("AQ-12")
def test_bad_input_gets_a_clear_error(rank_pool):
    # Scheduling on a closed queue is the next test's (NVRx 0.7.0 documents a restart there).
    assert_equal(
        "queue",
        rank_pool(1).run(_bad_input)[0],
        BadInput(schedule_non_requests=["TypeError", "TypeError"], pending=0, second_close="returned"),
        call="schedule_async_request(object()), (a tuple); close() twice",
    )


@pytest.mark.spec("AQ-16")
@pytest.mark.needs("persistent_caller")
def test_an_unpicklable_request_is_refused_at_schedule(rank_pool, tmp_path_factory):
    assert_equal(
        "queue",
        unpicklable(rank_pool, tmp_path_factory),
        Unpicklable(schedule_unpicklable="refused", next_index=0, finalized=[0]),
        call="schedule a request holding a lock, then a good one; finalize",
    )


@pytest.mark.spec("AQ-16w")
@pytest.mark.needs("persistent_caller")
def test_an_unpicklable_request_does_not_hang_the_queue(rank_pool, tmp_path_factory):
    # The run fails (BoundExceeded) where the finalize after the unpicklable request waited past 30 s; a refusal
    # at schedule, or a finalize that returns or raises in time, meets the weak level.
    unpicklable(rank_pool, tmp_path_factory)


@pytest.mark.spec("AQ-15")
@pytest.mark.needs("no_process_group")
@pytest.mark.parametrize("persistent", CALLERS)
@ranks(1, timeout=90)
def test_works_without_a_process_group(tmp_path, persistent):
    dist.destroy_process_group()
    log = os.path.join(tmp_path, "log")
    queue = async_core().AsyncCallsQueue(persistent=persistent)
    queue.schedule_async_request(request(None, log=log, tag="a"))
    call = "without a process group: schedule, blocking finalize with no_dist=False"
    assert_equal("maybe_finalize_async_calls()", finalize_queue(queue), [0], call=call)
    assert_equal("finalize fns run", lines(log), ["a"], call=call)
    queue.close()


# ---------------------------------------------------------------------------------- snapshot


def _snapshot(tmp, persistent, state_dict):
    gate, out = os.path.join(tmp, "gate"), os.path.join(tmp, "out.pt")
    state_dict = strategies.private_copy(state_dict, devices.current())
    expected = strategies.private_copy(state_dict)
    core = async_core()
    queue = kept(("AQ-14", persistent), lambda: core.AsyncCallsQueue(persistent=persistent))
    queue.schedule_async_request(core.AsyncRequest(workloads.save_when_open, (gate, state_dict, out), []))
    strategies.mutate_in_place(state_dict)  # the next training step, while the write waits
    workloads.open_gate(gate)
    finalize_queue(queue)
    assert_state_dict_equal(
        torch.load(out, weights_only=False),
        expected,
        call="data saved by an async call scheduled before an in-place update",
    )
    remove(gate, out)


def _close(queue):
    queue.close()


@pytest.mark.spec("AQ-14")
@pytest.mark.tensor_device
@pytest.mark.parametrize("persistent", CALLERS)
def test_async_fn_sees_the_data_as_scheduled(rank_pool, tmp_path_factory, persistent):
    examples_on_warm_ranks(  # one queue for every example (warm_savers.kept), closed at the end
        rank_pool(1),
        strategies.state_dicts(),
        _snapshot,
        _close,
        lambda state_dict: (str(tmp_path_factory.mktemp("snap")), persistent, state_dict),
    )
