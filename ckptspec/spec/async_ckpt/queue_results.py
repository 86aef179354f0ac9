"""The named results of test_queue.py's rank bodies: one class per test, compared field by field by assert_equal.

Module-level (and so picklable), as rank bodies return them from the rank processes.
"""

from dataclasses import dataclass

__all__ = [
    "Aborted",
    "BadInput",
    "CallerAnswers",
    "Closed",
    "DefaultQueue",
    "EveryRankFinished",
    "FailedCallDropped",
    "HeadOfLine",
    "PollCosts",
    "TwoQueues",
    "Unpicklable",
]


@dataclass(frozen=True)
class DefaultQueue:
    indices: list  # of two requests on AsyncCallsQueue()
    second_queue_first_index: int
    worker_processes: int  # that ran the two requests
    ran_in_trainer: bool


@dataclass(frozen=True)
class HeadOfLine:
    """What one queue showed for calls a (held by its gate) and b: a non-blocking poll, a's gate opened, a
    blocking finalize. Each test of the sequence judges only its own clause's fields."""

    scheduled: dict  # tag -> the index schedule_async_request returned
    pending_scheduled: int  # get_num_unfinalized_calls() right after both were scheduled
    poll_returned: list
    fns_run_by_poll: list  # tags whose finalize functions ran during the poll
    pending_after_poll: int
    blocking_returned: list
    fns_run_by_blocking: list
    pending_after: int


@dataclass(frozen=True)
class EveryRankFinished:
    poll_with_rank1_unfinished: list
    blocking_finalize: list
    finalize_fn_saw: list  # the done-markers of every rank, once per run of the finalize function


@dataclass(frozen=True)
class PollCosts:
    poll: list  # what a distributed poll with the call unfinished returned
    distributed_poll_all_reduces: list  # element counts of the all-reduces it issued
    no_dist_all_reduces: list  # of a no_dist poll and a no_dist blocking finalize


@dataclass(frozen=True)
class CallerAnswers:
    poll: bool  # is_current_async_call_done(blocking=False) while the call is held
    blocking: bool  # is_current_async_call_done(blocking=True) after it was released
    poll_type: str
    blocking_type: str
    poll_all_reduces: list  # element counts


@dataclass(frozen=True)
class FailedCallDropped:
    first_finalize: str
    pending_after_it: int
    next_finalize: list
    finalize_fns_run: list


@dataclass(frozen=True)
class Closed:
    finalize_fns_run: list
    pending: int


@dataclass(frozen=True)
class Aborted:
    finalize_fns_run: list
    runner_exists: bool  # the process that ran the aborted call: running, or not reaped


@dataclass(frozen=True)
class BadInput:
    schedule_non_requests: list  # what schedule_async_request did with an object() and a plain tuple
    pending: int
    second_close: str  # "returned" or the class name of what close() raised the second time


@dataclass(frozen=True)
class TwoQueues:
    indices: list  # of schedules alternating x, y, x, y
    fns_run_after_finalizing_x: list
    pending_x: int
    pending_y: int
    fns_run_after_finalizing_both: list


@dataclass(frozen=True)
class Unpicklable:
    schedule_unpicklable: str  # "refused" (TypeError or PicklingError), else what it did
    next_index: int
    finalized: list | str  # what the blocking finalize returned, or the class of what it raised
