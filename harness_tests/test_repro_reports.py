"""Maintainer reports (issue 45, item 7): every documented or implied data-loss or hang break of a stored run has
its report beside its reproducer and the reproducer's captured output; the reports are made deterministically from
their data; captured output is normalised. No reproducer runs here (they are captured by
ckptspec.report.repro_capture, on the release's environment)."""

from __future__ import annotations

import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

from ckptspec.report import clauses as clause_registry
from ckptspec.report import findings, repro_capture, repro_reports
from ckptspec.report.report import clause_verdict
from ckptspec.report.runs import REPO_ROOT, ReportError, load_run, page_name

RUNS = sorted((REPO_ROOT / "conformance" / "all").glob("*.json"))
REGISTRY = clause_registry.load()


def _breaks() -> list[tuple[str, str]]:
    found = []
    for path in RUNS:
        run = load_run(path)
        known = {**run.clauses, **REGISTRY}
        found += [
            (page_name(run), cid)
            for cid in REGISTRY
            if findings.reportable(run, cid, known[cid], clause_verdict(run, cid, known))
        ]
    return found


BREAKS = _breaks()


def test_the_stored_runs_have_reported_breaks():
    assert len(BREAKS) >= 20, BREAKS  # nvrx, mcore, lightning, torchtitan: guards the selection against going empty


@pytest.mark.parametrize(("release", "clause"), BREAKS, ids=[f"{r}/{c}" for r, c in BREAKS])
def test_every_break_has_its_report_and_captured_output(release, clause):
    base = REPO_ROOT / findings.REPRO_DIR / release
    assert (base / f"{clause}.md").is_file(), f"{release}/{clause}.md missing: python regenerate.py"
    release_out = base / f"{clause}.out"
    command = f"python -m ckptspec.report.repro_capture --release {release} --python PYTHON --clauses {clause}"
    assert release_out.is_file(), f"{release}/{clause}.out missing: {command}"
    assert repro_capture.read(release_out).exit_code == 1, f"{release}/{clause}.py did not reproduce the break"
    if repro_capture.IMPL in repro_capture.package_arguments(base / f"{clause}.py"):
        impl_out = base / f"{clause}.impl.out"
        assert impl_out.is_file(), f"{release}/{clause}.impl.out missing: {command}"
        assert repro_capture.read(impl_out).exit_code == 0, f"{release}/{clause}.py does not hold on impl"


def test_every_reported_break_has_a_title():
    titles = tomllib.loads((REPO_ROOT / repro_reports.TITLES).read_text())
    untitled = [
        (r, c) for r, c in BREAKS if c not in titles.get(r, {}) and c not in titles.get(r.rsplit("-", 1)[0], {})
    ]
    assert not untitled, untitled


# ---------------------------------------------------------------------------------------------- the generator

CLAUSES: dict[str, dict[str, Any]] = {
    "D-2": {"statement": "no data loss", "source": "002 'the quote'", "basis": "documented", "severity": "data-loss"},
    "C-1": {"statement": "a choice", "source": "x", "basis": "decision", "decision": "why", "severity": "hang"},
    "W-1": {"statement": "wrong error", "source": "y", "basis": "documented", "severity": "wrong-error"},
}
TITLES = {"lib": {"D-2": "Saver.save() drops the last item"}}


def _run(tmp_path: Path, version: str, outcome: str) -> Path:
    records = [
        {
            "nodeid": f"t.py::{cid}",
            "outcome": outcome,
            "clauses": [cid],
            "message": f"[{cid}] the writer skips the last item",
            "entry": {"clauses": [cid], "verdict": None, "intermittent": None},
        }
        for cid in CLAUSES
    ]
    path = tmp_path / f"lib-{version}.json"
    path.write_text(json.dumps({"target": "lib", "version": version, "clauses": CLAUSES, "tests": records}))
    return path


def _fixture(tmp_path: Path) -> tuple[list, Path]:
    versions = [("1.10", "xfail"), ("1.0", "xfail"), ("2.0", "passed"), ("1.9", "xfail")]
    runs = [load_run(_run(tmp_path, version, outcome)) for version, outcome in versions]
    impl = tmp_path / "impl.json"
    records = [{"nodeid": f"t.py::{c}", "outcome": "passed", "clauses": [c]} for c in CLAUSES]
    impl.write_text(json.dumps({"target": "impl", "version": "(source tree)", "clauses": CLAUSES, "tests": records}))
    root = tmp_path / "root"
    base = root / findings.REPRO_DIR / "lib-1.0"
    base.mkdir(parents=True)
    for cid in CLAUSES:
        (base / f"{cid}.py").write_text(f'"""{cid}.\n\n    python {cid}.py lib | impl\n"""\n')
    captured = repro_capture.Captured("python findings/repro/lib-1.0/D-2.py lib", "1", "under 10 s", ["BROKEN: x"], [])
    (base / "D-2.out").write_text(repro_capture.render(captured))
    return [*runs, load_run(impl)], root


def test_a_report_has_title_releases_promise_command_outputs_and_mechanism(tmp_path):
    runs, root = _fixture(tmp_path)
    made = repro_reports.reports(runs, CLAUSES, TITLES, root)
    assert list(made) == [Path(findings.REPRO_DIR) / "lib-1.0" / "D-2.md"]  # not the decision, not wrong-error
    text = next(iter(made.values()))
    assert text.startswith("# lib 1.0: Saver.save() drops the last item\n")
    affected, good = text.split("Known good:")
    listed = [line.split(":")[0] for line in affected.splitlines() if line.startswith("- ")]
    assert listed == ["- lib 1.0 (this report)", "- lib 1.9", "- lib 1.10"]  # release numbers as numbers
    assert "- lib 2.0: passes" in good
    assert "- impl (source tree), ckptspec's reference implementation" in good
    assert "> no data loss" in text
    seed = clause_registry.SEEDS["002"]
    assert (
        f"Basis: documented: promised by the library's own documents. Source: [002]({seed[1]} \"{seed[0]}\") 'the quote'"
        in text
    )
    assert "python findings/repro/lib-1.0/D-2.py lib\n" in text
    assert "exit status 1 (the clause breaks), under 10 s" in text
    assert "BROKEN: x" in text
    assert "On impl: not captured yet" in text
    assert "- the writer skips the last item" in text.split("## Mechanism in lib 1.0's code")[1]
    again = repro_reports.reports(list(reversed(runs)), CLAUSES, TITLES, root)
    assert made == again, "the same data, in any order, must give the same text"


def test_a_break_without_a_title_is_an_error(tmp_path):
    runs, root = _fixture(tmp_path)
    with pytest.raises(ReportError, match="no title for D-2"):
        repro_reports.reports(runs, CLAUSES, {}, root)


def test_the_findings_page_links_the_report(tmp_path):
    runs, root = _fixture(tmp_path)
    page = findings.page(runs[1], CLAUSES, root=root)
    assert "- **Report**: [`findings/repro/lib-1.0/D-2.md`](../../findings/repro/lib-1.0/D-2.md)" in page
    assert "lib-1.0/W-1.md" not in page


def test_the_committed_reports_are_what_the_generator_makes(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO_ROOT)
    first, second = tmp_path / "a", tmp_path / "b"
    for out in (first, second):
        assert repro_reports.main([*map(str, RUNS), "--out", str(out)]) == 0
    made = sorted(p.relative_to(first) for p in first.glob("*/*.md"))
    assert made == sorted(p.relative_to(second) for p in second.glob("*/*.md"))
    assert all((first / p).read_text() == (second / p).read_text() for p in made)
    committed = sorted(p.relative_to(REPO_ROOT / findings.REPRO_DIR) for p in REPO_ROOT.glob("findings/repro/*/*.md"))
    assert made == committed, "python regenerate.py"
    drifted = [p for p in made if (first / p).read_text() != (REPO_ROOT / findings.REPRO_DIR / p).read_text()]
    assert not drifted, f"{drifted}: python regenerate.py"


# -------------------------------------------------------------------------------------------- captured output


def test_captured_output_is_normalised_and_reads_back(tmp_path):
    noisy = (
        f'File "{REPO_ROOT}/findings/repro/x.py", line 3\n'
        f"  {sys.prefix}/lib/python3.12/site-packages/nvidia_resiliency_ext/core.py\n"
        "  /usr/lib/python3.12/multiprocessing/process.py\n"
        "/tmp/ckptspec-repro-k2j3/part pid 4242 at 127.0.0.1:29501 object at 0x7f3a2c1b9d10\n"
        "2026-11-27 03:22:11,123 INFO done\n"
    )
    text = repro_capture.normalise(noisy)
    assert text == (
        'File "findings/repro/x.py", line 3\n'
        "  <site-packages>/nvidia_resiliency_ext/core.py\n"
        "  <python>/multiprocessing/process.py\n"
        "<tmp>/part pid <pid> at 127.0.0.1:<port> object at 0x<addr>\n"
        "<time> INFO done\n"
    )
    captured = repro_capture.Captured("python a.py impl", "0", "under 10 s", ["HOLDS: y"], ["warning"])
    path = tmp_path / "a.out"
    path.write_text(repro_capture.render(captured))
    assert repro_capture.read(path) == captured
    assert repro_capture.read(path).exit_code == 0


def test_a_script_s_usage_line_gives_its_package_arguments(tmp_path):
    script = tmp_path / "X-1.py"
    script.write_text('"""X-1: what.\n\nMore.\n\n    python X-1.py nvidia_resiliency_ext | megatron.core | impl\n"""\n')
    assert repro_capture.package_arguments(script) == ["nvidia_resiliency_ext", "megatron.core", "impl"]


def test_a_capture_records_status_and_tail_without_warnings(tmp_path):
    script = tmp_path / "noisy.py"
    script.write_text(
        "import sys, warnings\n"
        "warnings.warn('import-time noise')\n"
        "print('[rank1]:W1127 04:39:09.158000 16480 torch/utils/cpp_extension.py:178] No CUDA', file=sys.stderr)\n"
        "print('rank 0 at 127.0.0.1:29500')\n"
        "print('BROKEN: seen', file=sys.stderr)\n"
        "sys.exit(1)\n"
    )
    captured = repro_capture.capture(sys.executable, script, "lib", bound_s=60, root=tmp_path)
    assert captured.command == "python noisy.py lib"
    assert captured.status == "1"
    assert captured.duration == "under 10 s"
    assert captured.stdout == ["rank 0 at 127.0.0.1:<port>"]
    assert captured.stderr == ["BROKEN: seen"]


def test_a_capture_past_its_bound_is_killed(tmp_path):
    script = tmp_path / "hangs.py"
    script.write_text("import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    captured = repro_capture.capture(sys.executable, script, "lib", bound_s=2, root=tmp_path)
    assert captured.status == "none: killed after the 2 s bound"
    assert captured.exit_code is None
    assert captured.stdout == ["started"]
