"""Several AsyncCallsQueues in one process (AQ-13): each finalizes and closes only its own calls."""

import os

import pytest

from ckptspec.spec.async_ckpt.queue_calls import FINALIZE_BOUND, finalize_queue, lines, request, two_queues
from ckptspec.spec.async_ckpt.queue_results import TwoQueues
from ckptspec.spec.harness.asserts import assert_equal, attempt
from ckptspec.spec.harness.processes import CALLERS, STARTUP_BOUND, async_core


@pytest.mark.spec("AQ-13")
@pytest.mark.parametrize("persistent", CALLERS)
def test_two_queues_do_not_interfere(rank_pool, tmp_path, persistent):
    assert_equal(
        "queues",
        # The workers' start (up to STARTUP_BOUND) is not the subject; the finalize of the calls that ran is.
        rank_pool(1).run(two_queues, str(tmp_path), persistent, timeout=STARTUP_BOUND + FINALIZE_BOUND)[0],
        TwoQueues(
            indices=[0, 0, 1, 1],
            fns_run_after_finalizing_x=["x0", "x1"],
            pending_x=0,
            pending_y=2,
            fns_run_after_finalizing_both=["x0", "x1", "y0", "y1"],
        ),
        call="two calls on each of queues x and y, interleaved; finalize x, then y",
    )


def _close_one_queue(tmp, persistent):
    log = os.path.join(tmp, "log")
    q1, q2 = (async_core().AsyncCallsQueue(persistent=persistent) for _ in range(2))
    q2.schedule_async_request(request(None, log=log, tag="y0"))
    q1.schedule_async_request(request(None, log=log, tag="x0"))
    finalize_queue(q1)
    q1.close()
    finalized = attempt(finalize_queue, q2)
    q2.close()
    return (finalized.value if finalized.returned else str(finalized)), sorted(lines(log))


@pytest.mark.spec("AQ-13")
@pytest.mark.parametrize("persistent", CALLERS)
def test_closing_one_queue_leaves_the_other_working(rank_pool, tmp_path, persistent):
    assert_equal(
        "queue y",
        rank_pool(1).run(_close_one_queue, str(tmp_path), persistent)[0],
        ([0], ["x0", "y0"]),
        call="schedule y0 on queue y and x0 on queue x; finalize x and close it; finalize y",
    )
