"""Verdict words (issue 30): a failure counts only against the clauses its entry names; words follow the basis."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptspec.report import verdicts
from ckptspec.report.runs import OUTCOMES, Record

REGISTRY: dict[str, dict[str, Any]] = {
    "D-1": {"statement": "documented", "basis": "documented", "snapshot": True},
    "I-1": {"statement": "implied", "basis": "implied"},
    "C-1": {"statement": "chosen", "basis": "decision", "decision": "why"},
}
GPU_SKIP = "Skipped: needs a CUDA device; this machine has none"
CAP_SKIP = "Skipped: target 'mcore' lacks storage_writer: FileSystemWriterAsync"
AREA_SKIP = "Skipped: not applicable: target 'dcp-thread' maps no NVRx module path, the storage area's subject"


def _record(outcome: str, charged=("D-1",), message: str = "", verdict=None, intermittent=None) -> Record:
    cited = frozenset({"D-1", "I-1"})
    if outcome not in ("xfail", "xpass"):
        return Record(outcome, cited, message=message)
    return Record(outcome, cited, frozenset(charged), verdict, intermittent, message)


records = st.builds(
    _record,
    st.sampled_from(OUTCOMES),
    st.sampled_from([("D-1",), ("I-1",), ("D-1", "I-1")]),
    st.sampled_from(["", GPU_SKIP, CAP_SKIP]),
)


def _judge(rs, clause="D-1"):
    return verdicts.judge(rs, clause, REGISTRY)


@given(st.lists(records, max_size=10))
def test_an_unexpected_failure_is_never_hidden(rs):
    unexpected = any(r.outcome in ("failed", "error") for r in rs)
    assert (_judge(rs).word == verdicts.UNEXPECTED) == unexpected


@given(st.lists(records, max_size=10))
def test_a_known_failure_counts_only_against_the_clauses_its_entry_names(rs):
    charged_here = any(r.outcome == "xfail" and "D-1" in r.charged for r in rs)
    word = _judge(rs).word
    assert (word == "breaks its documentation") == (charged_here and word != verdicts.UNEXPECTED)


@given(st.lists(records, max_size=10), st.randoms())
def test_the_verdict_ignores_the_order_of_tests(rs, random):
    shuffled = list(rs)
    random.shuffle(shuffled)
    assert str(_judge(shuffled)) == str(_judge(rs))


@given(st.lists(records, min_size=1, max_size=10))
def test_the_count_says_how_many_judging_tests_agree(rs):
    verdict = _judge(rs)
    if verdict.word == verdicts.NOT_JUDGED:
        assert all(r.outcome == "xfail" and "D-1" not in r.charged for r in rs)
    else:
        assert 1 <= verdict.k <= verdict.n <= len(rs)


@pytest.mark.parametrize(
    ("rs", "clause", "shown"),
    [
        ([], "D-1", "not covered"),
        ([_record("passed")] * 2, "D-1", "passes"),
        ([_record("xfail")], "D-1", "breaks its documentation"),
        ([_record("xfail", charged=("I-1",))], "I-1", "misses an implied rule"),
        ([_record("xfail", charged=("I-1",))], "D-1", "not judged (its tests fail on another clause)"),
        ([_record("xfail", charged=("I-1",)), _record("passed")], "D-1", "passes"),
        ([_record("xfail"), _record("passed")], "D-1", "breaks its documentation (1 of 2 tests)"),
        ([_record("xfail", verdict="api-changed")], "D-1", "API changed in this release"),
        ([_record("xfail", verdict="documented-otherwise")], "D-1", "not applicable (documented otherwise)"),
        ([_record("xfail", verdict="decision")], "D-1", "stricter than documented"),
        ([_record("xfail", verdict="decision"), _record("xfail")], "D-1", "breaks its documentation (1 of 2 tests)"),
        ([_record("xfail", verdict="implied")], "D-1", "misses an implied rule"),
        ([_record("xfail", verdict="blocked")], "D-1", "not judged (its tests fail on another clause)"),
        ([_record("xfail", verdict="blocked"), _record("passed")], "D-1", "passes (1 of 2 tests)"),
        ([_record("xfail", verdict="implied"), _record("xfail")], "D-1", "breaks its documentation (1 of 2 tests)"),
        ([_record("xpass", intermittent="failed 1 of 3 runs")], "D-1", "fails 1 of 3 runs"),
        ([_record("skipped", message=GPU_SKIP)], "D-1", "not run here (GPU)"),
        ([_record("skipped", message=CAP_SKIP)], "D-1", "not applicable (lacks storage_writer)"),
        ([_record("skipped", message=CAP_SKIP), _record("passed")], "D-1", "passes (1 of 2 tests)"),
        ([_record("skipped", message=AREA_SKIP)], "D-1", "not applicable (no such module)"),
        (
            [_record("skipped", message=AREA_SKIP), _record("skipped", message=CAP_SKIP)],
            "D-1",
            "not applicable (lacks storage_writer) (1 of 2 tests)",
        ),
        ([_record("skipped", message="Skipped: needs moto")], "D-1", "skipped"),
    ],
)
def test_examples(rs, clause, shown):
    assert str(verdicts.judge(rs, clause, REGISTRY)) == shown


def test_a_decision_clause_is_stricter_than_documented_not_broken():
    rs = [Record("xfail", frozenset({"C-1"}), frozenset({"C-1"}))]
    assert verdicts.judge(rs, "C-1", REGISTRY).word == "stricter than documented"


def test_a_snapshot_clause_says_it_judged_cpu_tensors():
    assert str(verdicts.judge([_record("passed")], "D-1", REGISTRY, cpu_tensors=True)) == "passes (CPU tensors)"
    assert str(verdicts.judge([_record("passed")], "I-1", REGISTRY, cpu_tensors=True)) == "passes"
    gpu = [_record("skipped", message=GPU_SKIP)]
    assert str(verdicts.judge(gpu, "D-1", REGISTRY, cpu_tensors=True)) == "not run here (GPU)"


@pytest.mark.parametrize(
    ("strict", "weak", "shown"),
    [
        ("passed", "passed", "passes"),
        ("xfail", "passed", "weak level only"),
        ("xfail", "xfail", "breaks its documentation (weak level too)"),  # the strict clause's word, not the weak's
        ("xfail", "failed", "breaks its documentation"),  # the weak row itself says FAILS: not hidden
        ("failed", "passed", "FAILS (not in expectations)"),
        ("skipped", "skipped", "skipped"),
    ],
)
def test_a_weak_level_shows_the_level_reached(strict, weak, shown):
    strict_verdict = verdicts.judge([_record(strict)], "D-1", REGISTRY)
    weak_verdict = verdicts.judge([_record(weak)], "D-1", REGISTRY)
    assert str(verdicts.level(strict_verdict, weak_verdict)) == shown


def test_a_weak_level_that_fails_on_some_runs_is_not_kept():
    """An intermittent entry's pass on the weak level is a race not seen this time: the strict clause is not "weak
    level only" then (that would say the weak level holds)."""
    strict = verdicts.judge([_record("xfail")], "D-1", REGISTRY)
    for outcome in ("xpass", "xfail"):
        weak = verdicts.judge([_record(outcome, intermittent="failed 4 of 10 runs")], "D-1", REGISTRY)
        shown = str(verdicts.level(strict, weak))
        assert shown.startswith("breaks its documentation (weak level too"), (outcome, shown)


def test_a_group_of_fault_tests_is_worded_by_the_clause_each_entry_charges():
    group = [_record("xfail", charged=("I-1",)), _record("passed")]
    assert str(verdicts.judge_tests(group, REGISTRY)) == "misses an implied rule (1 of 2 tests)"
    assert str(verdicts.judge_tests([], REGISTRY)) == "not covered"
