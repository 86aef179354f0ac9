"""The queue scenarios that a strict clause and its weak level judge from one run (ckptspec.spec.harness.shared_runs):
each rank body, and the test-side call that runs it once per test process.

A run that raised (a rank failed or hung) raises the same exception to both tests, so a weak level fails where the
strict run could not even finish (a hang), with the strict test's own message.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import threading
from pathlib import Path

from ckptspec.spec.async_ckpt.queue_calls import finalize_queue, lines, request
from ckptspec.spec.async_ckpt.queue_results import Aborted, EveryRankFinished, FailedCallDropped, Unpicklable
from ckptspec.spec.harness import workloads
from ckptspec.spec.harness.asserts import attempt, bounded
from ckptspec.spec.harness.processes import async_core, close_quietly, exists, wait_for_file
from ckptspec.spec.harness.ranks import world
from ckptspec.spec.harness.shared_runs import shared

__all__ = [
    "RANK1_LATE",
    "dropped_in_flight",
    "ended_in_flight",
    "every_rank_finished",
    "failed_call_dropped",
    "unpicklable",
]

RANK1_LATE = 1.0  # seconds


def _finalize_after_every_rank(tmp, persistent):
    rank, _size = world()
    gate, marker = os.path.join(tmp, f"gate{rank}"), os.path.join(tmp, f"done{rank}")
    seen = []

    def check_all_ranks_done():
        seen.append(sorted(f for f in os.listdir(tmp) if f.startswith("done")))

    core = async_core()
    queue = core.AsyncCallsQueue(persistent=persistent)
    queue.schedule_async_request(
        core.AsyncRequest(workloads.save_when_open, (gate, {"rank": rank}, marker), [check_all_ranks_done])
    )
    if rank == 0:
        workloads.open_gate(gate)
    first = finalize_queue(queue, blocking=False)  # rank 1's call cannot be done yet
    if rank == 1:
        # Not a timing assertion: rank 1's call finishes a while after every rank entered the blocking finalize, so
        # a rank that finalizes without waiting for the others does so every time, not only when it wins a race.
        threading.Timer(RANK1_LATE, workloads.open_gate, (gate,)).start()
    second = finalize_queue(queue)
    queue.close()
    return EveryRankFinished(first, second, seen)


def every_rank_finished(rank_pool, tmp_path_factory, persistent) -> list[EveryRankFinished]:
    """AQ-4's run on 2 ranks (one call per rank, rank 1's held by its gate during the poll): each rank's result."""
    return shared(
        tmp_path_factory,
        f"AQ-4-{persistent}",
        lambda: rank_pool(2).run(_finalize_after_every_rank, str(tmp_path_factory.mktemp("aq4")), persistent),
    )


def _failed_call_is_dropped(tmp, persistent):
    log = os.path.join(tmp, "log")
    queue = async_core().AsyncCallsQueue(persistent=persistent)
    queue.schedule_async_request(request(None, fail_with="disk full", log=log, tag="bad"))
    queue.schedule_async_request(request(None, log=log, tag="good"))
    first = attempt(
        queue.maybe_finalize_async_calls, True, False, bound=30, what="blocking finalize", hung_fails=True
    ).text
    pending = queue.get_num_unfinalized_calls()
    again = finalize_queue(queue, bound=30)
    close_quietly(queue)
    return FailedCallDropped(first, pending, again, lines(log))


def failed_call_dropped(rank_pool, tmp_path_factory, persistent) -> FailedCallDropped:
    """AQ-9's run (calls bad, whose async_fn fails, and good; finalize; finalize again)."""
    return shared(
        tmp_path_factory,
        f"AQ-9-{persistent}",
        lambda: rank_pool(1).run(_failed_call_is_dropped, str(tmp_path_factory.mktemp("aq9")), persistent)[0],
    )


def ended_in_flight(tmp, persistent, ending):
    """Schedule a call that never finishes, then end the queue: `close(abort=True)`, or drop its last reference
    (`drop`) and collect it. What ran of the call's finalize functions, and whether its process still exists."""
    log, pid_file = os.path.join(tmp, "log"), os.path.join(tmp, "pid")
    core = async_core()
    holder = [core.AsyncCallsQueue(persistent=persistent)]
    holder[0].schedule_async_request(workloads.held_call(core, tmp, log))
    wait_for_file(pid_file)
    if ending == "drop":

        def drop():
            holder.clear()  # the last reference: the queue is collected here, or by the collection below
            gc.collect()

        bounded(10, "dropping the queue's last reference and gc.collect()", drop)
    else:
        bounded(10, "close(abort=True)", holder[0].close, abort=True)
    runner = int(Path(pid_file).read_text())
    result = Aborted(lines(log), exists(runner))
    if result.runner_exists:
        # The verdict is taken; end the call's process ourselves, so that whenever the queue is collected (its
        # __del__ may join that process, NVRx 0.7.0's temporal queue does) the rank does not hang on it: the same
        # verdict on every run, whatever keeps the queue alive past this return.
        with contextlib.suppress(ProcessLookupError):
            os.kill(runner, signal.SIGKILL)
    return result


def dropped_in_flight(rank_pool, tmp_path_factory, persistent) -> Aborted:
    """AQ-17's run: the last reference to a queue dropped (no close()) while a call was in flight."""
    return shared(
        tmp_path_factory,
        f"AQ-17-{persistent}",
        lambda: rank_pool(1).run(ended_in_flight, str(tmp_path_factory.mktemp("aq17")), persistent, "drop")[0],
    )


def _unpicklable(tmp):
    core = async_core()
    queue = core.AsyncCallsQueue(persistent=True)
    held = core.AsyncRequest(workloads.gated, (threading.Lock(), None), [])
    refused = attempt(queue.schedule_async_request, held, named=(TypeError, pickle.PicklingError)).text
    idx = queue.schedule_async_request(request(None, log=os.path.join(tmp, "log"), tag="ok"))
    # A finalize that raises within the bound is recorded (AQ-16w allows it); one that hangs fails the run.
    what = "maybe_finalize_async_calls(blocking=True, no_dist=False)"
    done = attempt(queue.maybe_finalize_async_calls, True, False, bound=30, what=what, hung_fails=True)
    close_quietly(queue)
    return Unpicklable(
        "refused" if refused in ("TypeError", "PicklingError") else refused,
        idx,
        done.value if done.returned else done.text,
    )


def unpicklable(rank_pool, tmp_path_factory) -> Unpicklable:
    """AQ-16's run (schedule a request holding a lock, then a good one; finalize)."""
    return shared(
        tmp_path_factory, "AQ-16", lambda: rank_pool(1).run(_unpicklable, str(tmp_path_factory.mktemp("aq16")))[0]
    )
