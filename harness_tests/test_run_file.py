"""The conformance record's one type (ckptspec.report.run_file): every stored run reads back and writes
out the same JSON, so the writer (the plugin) and the readers share one format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ckptspec.report.run_file import PhaseRecord, ReportError, RunFile

REPO = Path(__file__).resolve().parents[1]


def _keys(path: Path) -> list[str]:
    text = path.read_text()
    return [key for key in ('"nodeid"', '"target"') if key in text]


STORED = sorted(path for path in (REPO / "conformance").rglob("*.json") if {'"nodeid"', '"target"'} <= set(_keys(path)))


def test_there_are_stored_runs_to_read():
    assert len(STORED) >= 10, STORED


@pytest.mark.parametrize("path", STORED, ids=lambda p: str(p.relative_to(REPO)))
def test_a_stored_run_reads_and_writes_back_unchanged(path, tmp_path):
    run = RunFile.read(path)
    assert run.tests, "a stored run records tests"
    run.write(tmp_path / "again.json")
    assert json.loads((tmp_path / "again.json").read_text()) == json.loads(path.read_text())


def test_an_expected_failures_entry_must_charge_clauses_the_test_cites(tmp_path):
    record = PhaseRecord("t::a", "xfail", clauses=("X-1",)).to_json() | {"entry": {"clauses": ["X-2"]}}
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"target": "t", "version": "1", "clauses": {}, "tests": [record]}))
    with pytest.raises(ReportError, match=r"tests\[0\]\.entry\.clauses must list clauses the test cites"):
        RunFile.read(path)
