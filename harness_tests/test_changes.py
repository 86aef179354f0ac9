"""What changed between two releases of one target (ckptspec.report.changes), as a findings page states it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ckptspec.report import changes, findings
from ckptspec.report.report import clause_verdict
from ckptspec.report.runs import Run, load_run

REGISTRY: dict[str, dict[str, Any]] = {
    cid: {"statement": f"promise {cid}", "source": "000 'quote'", "basis": "documented", "severity": "data-loss"}
    for cid in ("A-1", "A-2", "A-3", "A-4")
}


def _run(tmp_path: Path, target: str, version: str, broken: set[str]) -> Run:
    """A run of `target` at `version` where the clauses `broken` fail as expected and the others pass."""
    tests: list[dict[str, Any]] = []
    for cid in REGISTRY:
        record: dict[str, Any] = {"nodeid": f"t.py::{cid}", "outcome": "passed", "clauses": [cid]}
        if cid in broken:
            entry = {"clauses": [cid], "verdict": None, "intermittent": None}
            record = {**record, "outcome": "xfail", "message": f"[{cid}] why", "entry": entry}
        tests.append(record)
    path = tmp_path / f"{target}-{version}.json"
    path.write_text(json.dumps({"target": target, "version": version, "clauses": REGISTRY, "tests": tests}))
    return load_run(path)


def test_each_release_is_compared_with_the_next_older_release_of_its_target(tmp_path):
    old = _run(tmp_path, "lib", "0.9.1", set())
    mid = _run(tmp_path, "lib", "0.10.0", set())  # 0.10 is newer than 0.9: versions, not strings, are ordered
    new = _run(tmp_path, "lib", "2.0.0+cpu", set())
    other = _run(tmp_path, "other", "1.0", set())
    found = changes.predecessors([new, other, old, mid])
    assert {label: run.label for label, run in found.items()} == {
        "lib 0.10.0": "lib 0.9.1",
        "lib 2.0.0+cpu": "lib 0.10.0",
    }


def test_the_section_names_what_was_fixed_what_is_new_and_what_both_miss(tmp_path):
    older = _run(tmp_path, "lib", "1.0", {"A-1", "A-2"})
    newer = _run(tmp_path, "lib", "2.0", {"A-2", "A-3"})
    lines = changes.section(older, newer, REGISTRY, clause_verdict)
    assert lines[0] == "## Changed since lib 1.0"
    assert "- **Newly missed** (1): A-3 (breaks its documentation)." in lines
    assert "- **Fixed** (1): A-1 (was: breaks its documentation)." in lines
    assert "- **Missed by both** (1): A-2." in lines
    page = findings.page(newer, REGISTRY, root=tmp_path, previous=older)
    assert page.index("## Changed since lib 1.0") < page.index("## Breaks"), "the comparison opens the verdicts"
    assert "## Changed since" not in findings.page(older, REGISTRY, root=tmp_path)


def test_a_pass_of_a_race_seen_on_some_runs_is_not_a_fix(tmp_path):
    older = _run(tmp_path, "lib", "1.0", {"A-1"})
    newer = _run(tmp_path, "lib", "2.0", set())
    path = tmp_path / "lib-2.0.json"
    data = json.loads(path.read_text())
    entry = {"clauses": ["A-1"], "verdict": None, "intermittent": "failed 1 of 2 runs"}
    data["tests"][0] = {**data["tests"][0], "outcome": "xpass", "message": "[A-1] a race", "entry": entry}
    path.write_text(json.dumps(data))
    newer = load_run(path)
    lines = changes.section(older, newer, REGISTRY, clause_verdict)
    assert "- **Fixed** (0): none." in lines
    assert "- **Missed by both** (1): A-1 (breaks its documentation -> fails 1 of 2 runs)." in lines
