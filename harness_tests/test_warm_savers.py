"""warm_savers.examples_on_warm_ranks: the savers kept across a search are ended whatever happened, and the search's
failure stays the test's failure when ending them fails too (the clause the test cites is judged on its own body)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import strategies as st

from ckptspec.spec.harness.warm_savers import end_kept, examples_on_warm_ranks


class _Pool:
    """A RankPool stand-in: runs nothing, fails the body and/or the ending as told, counts the endings."""

    def __init__(self, body_fails: bool, ending_fails: bool) -> None:
        self.body_fails, self.ending_fails, self.endings = body_fails, ending_fails, 0

    def run(self, fn: Any, *args: Any) -> None:
        if fn is end_kept:
            self.endings += 1
            if self.ending_fails:
                raise RuntimeError("rank 0 exited with code -6 without reporting a result")
        elif self.body_fails:
            raise AssertionError("state_dict['a'] saved after the in-place update")


def _search(pool: _Pool) -> None:
    examples_on_warm_ranks(pool, st.just(1), lambda *a: None, lambda saver: None, lambda value: (value,))


def test_a_failing_search_stays_the_failure_when_ending_fails_too_and_carries_it_as_a_note():
    pool = _Pool(body_fails=True, ending_fails=True)
    with pytest.raises(AssertionError, match="saved after the in-place update") as failure:
        _search(pool)
    assert pool.endings == 1
    notes = getattr(failure.value, "__notes__", [])
    assert any("ending the savers" in n and "RuntimeError: rank 0 exited with code -6" in n for n in notes), notes


def test_ending_that_fails_after_a_passing_search_is_the_failure():
    pool = _Pool(body_fails=False, ending_fails=True)
    with pytest.raises(RuntimeError, match="exited with code -6"):
        _search(pool)
    assert pool.endings == 1


@pytest.mark.parametrize("body_fails", [False, True])
def test_the_savers_are_ended_once_whatever_the_search_did(body_fails):
    pool = _Pool(body_fails=body_fails, ending_fails=False)
    if body_fails:
        with pytest.raises(AssertionError) as failure:
            _search(pool)
        assert not any("ending" in note for note in getattr(failure.value, "__notes__", []))
    else:
        _search(pool)
    assert pool.endings == 1
