"""Merging runs of one target: a later run of a test replaces every earlier record of it; mixing targets is an error."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptspec.report.merge_runs import main, merge
from ckptspec.report.runs import OUTCOMES, ReportError, load_run

NODEIDS = ["t.py::a", "t.py::b", "t.py::c[x]", "t.py::c[y]"]
CLAUSES = {"X-1": {"statement": "one", "source": "s"}}
# One run: nodeid -> its records' (phase, outcome); a test may have a setup or teardown record besides its call.
records = st.lists(
    st.tuples(st.sampled_from(["setup", "call", "teardown"]), st.sampled_from(sorted(OUTCOMES))), min_size=1, max_size=2
)
runs = st.lists(st.dictionaries(st.sampled_from(NODEIDS), records, max_size=4), min_size=1, max_size=4)


def _write(path, run: dict, target="impl", version="1.0", clauses=CLAUSES):
    tests = [
        {"nodeid": n, "outcome": o, "when": w, "clauses": ["X-1"], "duration": 0.1, "message": ""}
        for n, recs in run.items()
        for w, o in recs
    ]
    path.write_text(json.dumps({"target": target, "version": version, "clauses": clauses, "tests": tests}))
    return path


@given(runs)
def test_the_latest_run_of_each_test_is_kept_whole(tmp_path_factory, given_runs):
    tmp = tmp_path_factory.mktemp("merge")
    paths = [_write(tmp / f"run{i}.json", run) for i, run in enumerate(given_runs)]
    model = {}  # the reference: each nodeid's records from the last run that has it
    for run in given_runs:
        model.update(run)
    merged = merge(paths)
    got: dict = {}
    for test in merged.tests:
        got.setdefault(test.nodeid, []).append((test.when, test.outcome))
    assert got == {n: list(recs) for n, recs in model.items()}
    assert merged.merged_from == [str(p) for p in paths]
    out = tmp / "merged.json"
    merged.write(out)
    assert load_run(out).label == "impl 1.0"


def test_the_clause_registry_is_the_union_with_the_later_entry_winning(tmp_path):
    old = _write(tmp_path / "a.json", {}, clauses={"X-1": {"statement": "old"}, "X-2": {"statement": "two"}})
    new = _write(tmp_path / "b.json", {}, clauses={"X-1": {"statement": "new"}})
    assert merge([old, new]).clauses == {"X-1": {"statement": "new"}, "X-2": {"statement": "two"}}


@pytest.mark.parametrize(("target", "version"), [("nvrx", "1.0"), ("impl", "2.0")])
def test_runs_of_another_target_or_release_are_refused(tmp_path, target, version):
    a = _write(tmp_path / "a.json", {"t.py::a": [("call", "passed")]})
    b = _write(tmp_path / "b.json", {}, target=target, version=version)
    with pytest.raises(
        ReportError, match=f"b.json: a run of '{target} {version}', but .*a.json is a run of 'impl 1.0'"
    ):
        merge([a, b])


def test_the_command_writes_a_new_file_and_refuses_to_overwrite_an_input(tmp_path, capsys):
    a = _write(tmp_path / "a.json", {"t.py::a": [("call", "failed")], "t.py::b": [("call", "passed")]})
    b = _write(tmp_path / "b.json", {"t.py::a": [("call", "passed")]})
    assert main([str(tmp_path / "m.json"), str(a), str(b)]) == 0
    assert load_run(tmp_path / "m.json").tests["t.py::a"][0] == "passed"
    with pytest.raises(SystemExit) as info:
        main([str(a), str(a), str(b)])
    assert info.value.code == 2
    assert "is also an input" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    assert main([str(tmp_path / "n.json"), str(a), str(bad)]) == 1
    assert "not valid JSON" in capsys.readouterr().err
    assert not (tmp_path / "n.json").exists()
