"""Scheduling on a closed queue (AQ-12's third part): refused with RuntimeError.

Apart from test_queue.py's other bad input because the releases document it differently: NVRx 0.7.0's
close() resets the queue and abort_nvrx_checkpoint relies on the next schedule restarting the worker, so that
release is judged by its own documents there, and by the spec's decision for the rest of AQ-12.
"""

import os

import pytest

from ckptspec.spec.async_ckpt.queue_calls import finalize_queue, request
from ckptspec.spec.harness.asserts import assert_equal, attempt, bounded
from ckptspec.spec.harness.processes import CALLERS, async_core


def _schedule_after_close(tmp, persistent):
    log = os.path.join(tmp, "log")
    queue = async_core().AsyncCallsQueue(persistent=persistent)
    queue.schedule_async_request(request(None, log=log, tag="before"))
    finalize_queue(queue)
    bounded(60, "close()", queue.close)
    after = attempt(
        queue.schedule_async_request, request(None, log=log, tag="after"), bound=60, what="schedule after close()"
    )
    if after.returned:  # the queue took the call: let it finish, so that no worker outlives the test
        finalize_queue(queue)
        bounded(60, "close()", queue.close)
    return after.text


@pytest.mark.spec("AQ-12")
@pytest.mark.parametrize("persistent", CALLERS)
def test_scheduling_on_a_closed_queue_is_refused(rank_pool, tmp_path, persistent):
    assert_equal(
        "schedule_async_request() after close()",
        rank_pool(1).run(_schedule_after_close, str(tmp_path), persistent)[0],
        "RuntimeError",
        call="one call scheduled and finalized; close(); schedule_async_request(request)",
    )
