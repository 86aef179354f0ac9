"""Recording how expected failures fail (issue 30): raises / match proposed from a run, checked, written in place."""

from __future__ import annotations

import json
from dataclasses import replace

from ckptspec.report.run_file import EntryRecord, FailureRecord, PhaseRecord, RunFile
from ckptspec.spec.harness import expectations, record_failures

_FILE = """\
# a comment that must survive
[[xfail]]
test = "t.py::test_abort"
clause = "AQ-11"
reason = "no abort parameter"

[[xfail]]
test = "t.py::test_hang"
clause = "AQ-7"
reason = "waits forever"

[[xfail]]
test = "t.py::test_mixed"
clause = "AQ-3"
reason = "fails two ways"
"""
_RANKS = "RankFailures: 1 of 2 ranks failed:\n\nrank 1 raised\n    Traceback (most recent call last):\n"
_ABORT = _RANKS + "    TypeError: close() got an unexpected keyword argument 'abort'\n[AQ-11] statement"


def _record(test: str, clause: str, failure_type: str, text: str) -> PhaseRecord:
    entry = EntryRecord((clause,))
    return PhaseRecord(test, "xfail", clauses=(clause,), entry=entry, failure=FailureRecord(failure_type, text))


def test_proposals_are_the_targets_exception_and_stable_words(tmp_path):
    path = tmp_path / "x.expectations.toml"
    path.write_text(_FILE)
    run = RunFile(
        "t",
        "1.0",
        {},
        [
            _record("t.py::test_abort[persistent]", "AQ-11", "RankFailures", _ABORT),
            _record("t.py::test_abort[temporal]", "AQ-11", "RankFailures", _ABORT),
            _record("t.py::test_hang", "AQ-7", "BoundExceeded", "BoundExceeded: finalize did not return within 90 s"),
            _record("t.py::test_mixed[a]", "AQ-3", "ValueError", "ValueError: one way"),
            _record("t.py::test_mixed[b]", "AQ-3", "KeyError", "KeyError: 'another'"),
        ],
    )
    proposals, problems = record_failures.propose(run, expectations.load(str(path)))
    by_test = {entry.test: fields for entry, fields in proposals.items()}
    assert by_test["t.py::test_abort"] == {
        "raises": "TypeError",
        "match": r"close\(\)\ got\ an\ unexpected\ keyword\ argument",
    }
    assert by_test["t.py::test_hang"] == {"raises": "BoundExceeded", "match": r"finalize\ did\ not\ return\ within"}
    assert "t.py::test_mixed" not in by_test
    assert problems == ["t.py::test_mixed [AQ-3]: its 2 failures share no exception class"]
    assert record_failures.write(path, proposals) == 2
    expectations.load.cache_clear()  # load() caches by path
    text = path.read_text()
    assert text.startswith("# a comment that must survive\n")
    written = {e.test: (e.raises, e.match) for e in expectations.load(str(path))}
    assert written["t.py::test_abort"] == ("TypeError", r"close\(\)\ got\ an\ unexpected\ keyword\ argument")
    assert written["t.py::test_mixed"] == (None, None)
    # What was written fits the failures it came from.
    (abort,) = (e for e in expectations.load(str(path)) if e.test == "t.py::test_abort")
    assert expectations.failure_problem(abort, ["RankFailures"], _ABORT) is None
    assert json.dumps(by_test)  # plain strings only


def test_new_stubs_one_entry_per_uncovered_failure_that_loads_and_fits_it(tmp_path, capsys):
    path = tmp_path / "mine.expectations.toml"
    path.write_text("# Known failures of mine.\nxfail = []\n")
    failed = replace(_record("t.py::test_abort[persistent]", "AQ-11", "RankFailures", _ABORT), outcome="failed")
    several = replace(
        _record("t.py::test_two", "AQ-5", "ValueError", "ValueError: the request was refused at close"),
        outcome="error",
        clauses=("AQ-5", "AQ-6"),
    )
    run = RunFile("t", "1.0", {}, [failed, several, replace(failed, nodeid="t.py::test_ok", outcome="passed")])
    run_file = tmp_path / "run.json"
    run.write(run_file)
    assert record_failures.main([str(run_file), str(path), "--new", "--write"]) == 0
    expectations.load.cache_clear()
    entries = {e.test: e for e in expectations.load(str(path))}
    assert sorted(entries) == ["t.py::test_abort[persistent]", "t.py::test_two"], "one stub per failed test"
    abort, two = entries["t.py::test_abort[persistent]"], entries["t.py::test_two"]
    assert (abort.clauses, abort.raises) == (("AQ-11",), "TypeError")
    assert two.clauses == ("AQ-5", "AQ-6"), "every cited clause, to be narrowed by hand"
    assert abort.reason == record_failures.FILL_IN
    assert expectations.failure_problem(abort, ["RankFailures"], _ABORT) is None, "the stub fits its failure"
    assert "# Known failures of mine." in path.read_text()
    # Run again on the same run: the failures are covered now, so nothing more is stubbed.
    capsys.readouterr()
    assert record_failures.main([str(run_file), str(path), "--new"]) == 0
    out = capsys.readouterr()
    assert "[[xfail]]" not in out.out
    assert out.err.count("not stubbed") == 2
