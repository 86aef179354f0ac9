"""What a poll and a blocking finalize finalize (AQ-5), and the pending count each leaves (AQ-6).

Both run the sequence of test_queue.py's AQ-3 test (queue_calls.head_of_line): calls a (held by its gate) and b,
a non-blocking poll, a's gate opened, a blocking finalize. Each test judges its own clause only, from whose
finalize functions ran, so a wrong returned index (AQ-3) leaves these verdicts standing.
"""

import pytest

from ckptspec.spec.async_ckpt.queue_calls import head_of_line
from ckptspec.spec.harness.asserts import assert_equal
from ckptspec.spec.harness.processes import CALLERS

SEQUENCE = "calls a (held by its gate), b; poll; open a's gate; blocking finalize"


@pytest.mark.spec("AQ-5")
@pytest.mark.parametrize("persistent", CALLERS)
def test_a_poll_leaves_the_unfinished_call_and_a_blocking_finalize_finishes_all(rank_pool, tmp_path, persistent):
    # The poll returns at all (the gate opens only after it, within finalize_queue's bound), without finalizing
    # a; b, already done, may be finalized by either step (its order behind a is AQ-4's matter).
    seen = rank_pool(1).run(head_of_line, str(tmp_path), persistent)[0]
    assert_equal(
        "queue",
        {
            "poll finalized the held call a": "a" in seen.fns_run_by_poll,
            "finalized by the end": sorted(seen.fns_run_by_poll + seen.fns_run_by_blocking),
        },
        {"poll finalized the held call a": False, "finalized by the end": ["a", "b"]},
        call=SEQUENCE,
    )


@pytest.mark.spec("AQ-6")
@pytest.mark.parametrize("persistent", CALLERS)
def test_the_pending_count_is_what_is_not_yet_finalized(rank_pool, tmp_path, persistent):
    seen = rank_pool(1).run(head_of_line, str(tmp_path), persistent)[0]
    after_poll = 2 - len(set(seen.fns_run_by_poll))
    assert_equal(
        "get_num_unfinalized_calls()",
        {
            "scheduled": seen.pending_scheduled,
            "after poll": seen.pending_after_poll,
            "after blocking": seen.pending_after,
        },
        {"scheduled": 2, "after poll": after_poll, "after blocking": after_poll - len(set(seen.fns_run_by_blocking))},
        call=SEQUENCE,
    )
