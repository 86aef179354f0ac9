"""Provenance of recorded runs: a recorded run says where it came from, a merged run keeps each part's, every stored
run has some, and `ckptspec judge`'s report says when a version was judged without expectations."""

from __future__ import annotations

import json
from pathlib import Path

from ckptspec.cli import summary
from ckptspec.report import advice, provenance, releases
from ckptspec.report import clauses as clause_registry
from ckptspec.report.merge_runs import merge
from ckptspec.report.runs import Record, Run, load_run
from harness_tests.pytest_runs import clean_env, run_pytest

ROOT = Path(__file__).resolve().parents[1]
CLAUSES = {"X-1": {"statement": "one", "source": "s"}}


def _run(path: Path, nodeid: str, part: dict | None) -> Path:
    test = {"nodeid": nodeid, "outcome": "passed", "when": "call", "clauses": ["X-1"], "duration": 0.1, "message": ""}
    data: dict[str, object] = {"target": "impl", "version": "1.0", "clauses": CLAUSES, "tests": [test]}
    if part is not None:
        data |= {"format": provenance.FORMAT, "provenance": [part]}
    path.write_text(json.dumps(data))
    return path


def test_a_merged_run_keeps_every_parts_provenance_once_in_order(tmp_path):
    first, second = {"commit": "a", "date": "d1"}, {"commit": "b", "date": "d2"}
    paths = [
        _run(tmp_path / "full.json", "t.py::a", first),
        _run(tmp_path / "old.json", "t.py::b", None),  # a run of format 1 adds no part
        _run(tmp_path / "rerun.json", "t.py::a", second),
        _run(tmp_path / "again.json", "t.py::a", first),
    ]
    merged = merge(paths)
    assert merged.provenance == [first, second]
    assert merged.format == provenance.FORMAT


def test_a_recorded_run_says_where_it_came_from(tmp_path):
    out = tmp_path / "run.json"
    args = [
        "ckptspec/spec/test_api_surface.py",
        "-q",
        "-p",
        "no:randomly",
        "--impl",
        "impl",
        "--conformance-json",
        str(out),
    ]
    run = run_pytest(args, env=clean_env(**{provenance.NO_EXPECTATIONS_VAR: "a test's reason"}))
    assert run.code == 0, run.describe()
    (part,) = json.loads(out.read_text())["provenance"]
    assert set(provenance.FIELDS) <= set(part)
    assert (part["target"], part["tensor_device"]) == ("impl", "cpu")
    assert part["expectations"] == "not applied: a test's reason"
    assert part["command"].startswith("pytest ckptspec/spec/test_api_surface.py")
    assert part["torch"] != provenance.UNKNOWN
    assert part["python"] != provenance.UNKNOWN


def test_every_stored_run_has_provenance_and_the_listed_runs_name_their_release():
    for path in sorted((ROOT / "conformance" / "all").glob("*.json")):
        run = load_run(path)
        assert run.provenance, f"{path.name}: no provenance (python -m ckptspec.report.provenance --reconstruct)"
        for part in run.provenance:
            reference = path.stem in (releases.REFERENCE, releases.LOCAL_REFERENCE)
            assert releases.base_version(str(part["version"])) in path.stem or reference


def test_the_report_of_a_version_without_a_recorded_run_says_so_and_charges_its_failure():
    run = load_run(ROOT / "conformance" / "all" / "nvrx-0.4.1.json")
    registry = clause_registry.load()
    rules = advice.load(registry)
    failing = Record("failed", frozenset({"AQ-4"}), message="AssertionError")
    tests = {n: r for n, r in run.tests.items() if "AQ-4" not in r.cited} | {"x.py::t": failing}
    unrecorded = Run(run.label, run.clauses, tests, run.tensor_device, run.provenance)
    text = summary(unrecorded, registry, rules, recorded=False, wall_s=1)
    assert "No recorded run of this version exists" in text
    assert "AQ-4:" in text
    assert "FAILS (not in expectations)" in text
    recorded = summary(run, registry, rules, recorded=True, wall_s=1)
    assert "This release has a recorded run here" in recorded
    assert "What to do:" in recorded


def test_the_report_counts_the_clauses_another_clauses_break_leaves_unjudged():
    """torch_checkpointing's default configuration: every save fails (P-DEFAULT-1), its other clauses' entries are
    `blocked`, and the report says they were not judged rather than counting them as skipped."""
    run = load_run(ROOT / "conformance" / "all" / "torch-checkpointing-0.1.1.json")
    registry = clause_registry.load()
    text = summary(run, registry, advice.load(registry), recorded=True, wall_s=1)
    assert "P-DEFAULT-1:" in text
    assert "Not judged: " in text
