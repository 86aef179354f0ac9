"""Findings at a glance and the usage rules (issue 45, items 5-6): generated from the runs, ordered, never stale."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from ckptspec.report import advice, findings, glance
from ckptspec.report import clauses as clause_registry
from ckptspec.report.runs import REPO_ROOT, ReportError, load_run

REGISTRY: dict[str, dict[str, Any]] = {
    "D-1": {"statement": "s", "symptom": "wrong index", "source": "q", "basis": "documented", "severity": "cosmetic"},
    "D-2": {"statement": "s", "symptom": "write lost", "source": "q", "basis": "documented", "severity": "data-loss"},
    "I-1": {"statement": "s", "symptom": "finalize hangs", "source": "q", "basis": "implied", "severity": "hang"},
    "I-2": {"statement": "s", "symptom": "old data", "source": "q", "basis": "implied", "severity": "data-loss"},
    "C-1": {"statement": "s", "symptom": "no fsync", "source": "q", "basis": "decision", "severity": "leak"},
    "P-1": {"statement": "s", "symptom": "never seen", "source": "q", "basis": "documented", "severity": "hang"},
}
RULE = """
[[rule]]
libraries = ["nvrx"]
rule = "Bound the finalize"
because = "it hangs"
instead = "poll with a deadline"
clauses = ["I-1"]

[[rule]]
libraries = ["nvrx"]
rule = "Nothing to do here"
because = "never"
instead = "n/a"
clauses = ["P-1"]
"""


def _run(tmp_path: Path, version: str, failing: list[str]) -> Any:
    tests = [
        {
            "nodeid": f"t.py::{cid}",
            "outcome": "xfail",
            "clauses": [cid],
            "message": f"[{cid}] mechanism",
            "entry": {"clauses": [cid], "verdict": None, "intermittent": None},
        }
        for cid in failing
    ]
    tests += [
        {"nodeid": f"t.py::{cid}", "outcome": "passed", "clauses": [cid]} for cid in REGISTRY if cid not in failing
    ]
    path = tmp_path / f"nvrx-{version}.json"
    path.write_text(json.dumps({"target": "nvrx", "version": version, "clauses": REGISTRY, "tests": tests}))
    return load_run(path)


def _rules(tmp_path: Path, text: str = RULE) -> list[advice.Rule]:
    path = tmp_path / "advice.toml"
    path.write_text(text)
    return advice.load(REGISTRY, path)


def test_the_table_orders_breaks_by_severity_then_basis_and_keeps_decisions_apart(tmp_path):
    old = _run(tmp_path, "0.1", ["D-1", "D-2", "I-1", "I-2", "C-1"])
    new = _run(tmp_path, "0.2", ["I-1"])
    text = glance.render([old, new], REGISTRY, _rules(tmp_path), root=tmp_path)
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and "---" not in line]
    assert [row[2] for row in rows[1:]] == ["D-2", "I-2", "I-1", "D-1"]  # data-loss (documented first), hang, cosmetic
    assert rows[1][1] == "write lost"  # the clause's symptom
    assert rows[3][4] == "0.1, 0.2"  # the releases that break it
    decisions = next(line for line in text.splitlines() if line.startswith("Does not meet these decisions"))
    assert "leak: C-1" in decisions
    assert "C-1" not in [row[2] for row in rows]
    assert "never seen" not in text
    assert "P-1" not in text


def test_a_rule_applies_only_to_releases_that_break_one_of_its_clauses(tmp_path):
    rules = _rules(tmp_path)
    old, new, fixed = _run(tmp_path, "0.1", ["I-1"]), _run(tmp_path, "0.2", ["I-1"]), _run(tmp_path, "0.3", [])
    text = glance.render([old, new, fixed], REGISTRY, rules, root=tmp_path)
    assert "- Bound the finalize (I-1; 0.1, 0.2)." in text
    assert "Nothing to do here" not in text
    page = findings.page(new, REGISTRY, root=tmp_path, rules=rules)
    assert "## What to do (1)" in page
    assert "Instead: poll with a deadline." in page
    assert "I-1 (misses an implied rule)" in page
    assert "What to do" not in findings.page(fixed, REGISTRY, root=tmp_path, rules=rules)


@pytest.mark.parametrize(
    ("change", "complaint"),
    [
        (('clauses = ["I-1"]', 'clauses = ["NO-1"]'), "unknown clauses ['NO-1']"),
        (('libraries = ["nvrx"]', 'libraries = ["nvrz"]'), "unknown libraries ['nvrz']"),
        (('instead = "poll with a deadline"\n', ""), "needs exactly the fields"),
        (('rule = "Bound the finalize"', 'rule = ""'), "'rule' must be a non-empty string"),
    ],
)
def test_a_bad_rule_is_refused_naming_it(tmp_path, change: tuple[str, str], complaint):
    with pytest.raises(ReportError, match="rule 1") as refused:
        _rules(tmp_path, RULE.replace(change[0], change[1], 1))
    assert complaint in str(refused.value)


def test_every_rule_of_the_advice_file_applies_to_a_stored_release():
    registry = clause_registry.load()
    runs = [load_run(path) for path in sorted((REPO_ROOT / "conformance" / "all").glob("*.json"))]
    known = {**{cid: entry for run in runs for cid, entry in run.clauses.items()}, **registry}
    stale = [rule.rule for rule in advice.load(known) if not any(advice.applies(rule, run, known) for run in runs)]
    assert not stale, f"rules that no stored release needs any more (remove them, or name their clauses): {stale}"
