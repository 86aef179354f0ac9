"""Every page says the same verdict and severity of a cell (issue 61 item 4).

Read from the committed pages (kept equal to their data by `python regenerate.py --check`): the conformance,
protocol and manager tables of docs/results.md, the fault matrix there (ckptspec/faults/matrix.py), the cells of
docs/results.html, and each run's findings page. A cell's words agree across them; the findings page lists a clause
in the section its verdict names, with the run's severity; a weak level is never more severe than its strict clause
without a stated `severity_reason`; every maintainer report names at least one affected release.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ckptspec.faults import matrix
from ckptspec.report import clauses as clause_registry
from ckptspec.report import findings, verdicts
from ckptspec.report.report import clause_verdict
from ckptspec.report.results_page import with_severity
from ckptspec.report.runs import REPO_ROOT, Run, load_run, page_name, stored_runs

RESULTS = REPO_ROOT / "docs" / "results.md"
RESULTS_PAGE = REPO_ROOT / "docs" / "results.html"
FINDINGS = REPO_ROOT / "docs" / "findings"
REPORTS = REPO_ROOT / "findings" / "repro"
REGISTRY = clause_registry.load()
RUNS = {run.label: run for run in map(load_run, stored_runs())}


def _tables(text: str) -> dict[tuple[str, str], str]:
    """(clause, run label) -> cell text of the clause tables of docs/results.md (not the fault matrix)."""
    cells: dict[tuple[str, str], str] = {}
    header: list[str] = []
    for line in text.splitlines():
        if not line.startswith("| "):
            header = []
            continue
        row = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if row[:1] == ["clause"]:
            header = row
        elif header and row[0] in REGISTRY:
            cells.update({(row[0], label): cell for label, cell in zip(header[4:], row[4:], strict=True)})
    return cells


class _Cells(HTMLParser):
    """(clause, page name) -> text of each cell of results.html."""

    def __init__(self) -> None:
        super().__init__()
        self.cells: dict[tuple[str, str], str] = {}
        self._clause = ""
        self._cell: tuple[str, str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-clause" in a:
            self._clause = a["data-clause"] or ""
        elif tag == "td" and "data-word" in a:
            self._cell = (self._clause, a["data-target"] or "")
            self.cells[self._cell] = ""

    def handle_endtag(self, tag):
        if tag == "td":
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self.cells[self._cell] += data


def _section(page: str, cid: str) -> str | None:
    """The section of a findings page that lists `cid`, and how: "breaks <sev>: <verdict>", "stricter <sev>", "weak",
    "otherwise <verdict>", "not judged", or None."""
    anchor = f'<a id="clause-{cid.lower()}"></a>'
    if anchor not in page:
        return None
    after = page.split(anchor, 1)[1]
    if m := re.match(rf"\s*### {re.escape(cid)} \(([^)]*)\): (.*)", after):
        return f"breaks {m[1]}: {m[2]}"
    if m := re.match(rf"{re.escape(cid)} \(([^)]*)\): ", after):
        return f"stricter {m[1]}"
    if after.startswith(f"{cid}: misses the strict clause"):
        return "weak"
    if after.startswith(f"{cid}: {verdicts.NOT_JUDGED}"):
        return "not judged"
    if m := re.match(rf"{re.escape(cid)}: (.*)", after):
        return f"otherwise {m[1]}"
    return f"unknown: {after[:80]}"


def _expected(run: Run, cid: str, verdict: verdicts.Verdict) -> str | None:
    severity = str(run.severity(cid, REGISTRY[cid].get("severity", "")))
    decision = verdicts.basis_of(REGISTRY[cid]) == "decision"
    if (verdict.broken and verdict.word != verdicts.BROKEN_WORDS["decision"]) or (
        verdict.intermittent and not decision
    ):
        return f"breaks {severity}: {verdict}"
    if verdict.word == verdicts.BROKEN_WORDS["decision"] or (verdict.intermittent and decision):
        return f"stricter {severity}"
    if verdict.word == verdicts.WEAK_ONLY:
        return "weak"
    if verdict.word in (verdicts.API_CHANGED, verdicts.DOCUMENTED_OTHERWISE):
        return f"otherwise {verdict}"
    if verdict.word == verdicts.NOT_JUDGED:
        return "not judged"
    return None


def test_results_md_results_html_and_the_findings_pages_agree_on_every_cell():
    tables = _tables(RESULTS.read_text())
    parser = _Cells()
    parser.feed(RESULTS_PAGE.read_text())
    wrong = []
    for label, run in RUNS.items():
        path = FINDINGS / f"{page_name(run)}.md"
        page = path.read_text() if path.exists() else None  # impl-local has no findings page
        for cid, clause in REGISTRY.items():
            verdict = clause_verdict(run, cid, REGISTRY)
            cell = str(with_severity(run, cid, verdict, clause))
            shown = {
                "results.md": tables.get((cid, label), cell),
                "results.html": parser.cells.get((cid, page_name(run)), cell),
            }
            wrong += [
                f"{label} {cid}: {where} says {text!r}, not {cell!r}" for where, text in shown.items() if text != cell
            ]
            if page is None:
                continue
            listed, expected = _section(page, cid), _expected(run, cid, verdict)
            if listed != expected:
                wrong.append(f"{label} {cid}: findings page lists {listed!r}, the tables say {expected!r}")
    assert len(tables) > 1000, "the tables of results.md were read"
    assert len(parser.cells) > 1000, "the cells of results.html were read"
    assert not wrong, "\n".join(wrong[:40])


def _fault_matrix(text: str) -> dict[tuple[str, str, str], str]:
    """(family, run label, phase) -> cell of the fault matrix in docs/results.md."""
    block = text.split(matrix.START_MARKER, 1)[1].split(matrix.END_MARKER, 1)[0]
    cells, family = {}, ""
    for line in block.splitlines():
        row = [c.strip() for c in line.strip().split("|")[1:-1]]
        if len(row) != 2 + len(matrix.PHASES) or row[0] == "fault" or row[0].startswith("-"):
            continue
        if m := re.search(r"\((FI-[A-Z0-9]+)-\*\)", row[0]):
            family = m[1]
        elif row[0]:
            family = ""  # the orphan audit's rows
        if family:
            cells.update({(family, row[1], phase): cell for phase, cell in zip(matrix.PHASES, row[2:], strict=True)})
    return cells


def test_the_fault_matrix_says_of_a_known_failure_what_its_clause_says():
    """A matrix cell that names a missed clause's word (a break, a decision, the weak level only, a failure on some
    runs) is the verdict of a clause of that fault charged by the cell's tests, as its row and findings page say."""
    cells = _fault_matrix(RESULTS.read_text())
    assert cells, "the fault matrix was read"
    wrong = []
    for (family, label, phase), cell in cells.items():
        run = RUNS[label]
        word = cell.split(" (")[0] if not cell.startswith(verdicts.SOME_RUNS) else cell
        missed = word in (*verdicts.BROKEN_WORDS.values(), verdicts.WEAK_ONLY) or word.startswith(verdicts.SOME_RUNS)
        if not missed:
            continue
        tests = [r for n, r in run.tests.items() if matrix.phase_of(n) == phase and family in matrix.families(r.cited)]
        charged = {cid for r in tests for cid in r.charged}
        words = {cid: clause_verdict(run, cid, REGISTRY) for cid in charged}
        if not any(cell.startswith(v.word) for v in words.values()):
            said = ", ".join(f"{cid}: {v}" for cid, v in sorted(words.items()))
            wrong.append(f"{label} {family} [{phase}]: the matrix says {cell!r}; its clauses say {said}")
    assert not wrong, "\n".join(wrong)


def test_a_weak_level_is_never_more_severe_than_its_strict_clause_without_a_reason():
    wrong = [
        f"{weak} ({REGISTRY[weak]['severity']}) is more severe than {strict} ({REGISTRY[strict]['severity']})"
        for strict, weak in clause_registry.weak_levels(REGISTRY).items()
        if findings.severity_rank(REGISTRY[weak]["severity"]) < findings.severity_rank(REGISTRY[strict]["severity"])
        and not str(REGISTRY[weak].get("severity_reason", "")).strip()
    ]
    assert not wrong, "state a severity_reason in the weak clause, or fix a severity:\n" + "\n".join(wrong)


@pytest.mark.parametrize("report", sorted(REPORTS.glob("*/*.md")), ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_maintainer_report_names_an_affected_release(report: Path):
    text = report.read_text()
    affected = text.split("## Affected releases", 1)[1].split("Known good:", 1)[0]
    assert re.search(r"(?m)^- \S", affected), f"{report}: its 'Affected releases' lists no release"


def test_a_mechanism_shared_by_several_clauses_is_charged_once():
    """A clause whose expectations reason says its failure is another clause's mechanism ("FI-STORAGE-1's
    mechanism: ...") names a clause the same run charges and its findings page lists under Breaks; the page sends
    the reader there rather than to a report of its own (one mechanism, one verdict, one report)."""
    wrong, seen = [], 0
    for label, run in RUNS.items():
        path = FINDINGS / f"{page_name(run)}.md"
        page = path.read_text() if path.exists() else ""
        for cid in REGISTRY:
            said = {m[1] for reason in findings.mechanisms(run, cid) if (m := re.match(r"^(\S+)'s mechanism:", reason))}
            if not said:
                continue
            seen += 1
            other = findings.shared_mechanism(run, cid)
            if other is None or said != {other}:
                wrong.append(
                    f"{label} {cid}: its reasons name {sorted(said)}'s mechanism, which this run does not charge"
                )
                continue
            if page and not (_section(page, other) or "").startswith("breaks "):
                wrong.append(f"{label} {cid}: {other}, whose mechanism it shares, is not listed under Breaks")
            if (
                page
                and f"its strict break is {other}'s mechanism"
                not in page.split(f'id="clause-{cid.lower()}"', 1)[-1].split("\n", 1)[0]
            ):
                wrong.append(f"{label} {cid}: the findings page does not say it shares {other}'s mechanism")
            if (REPO_ROOT / findings.report_path(run, cid)).exists():
                wrong.append(f"{label} {cid}: a report of its own beside {other}'s")
    assert seen, "no reason names another clause's mechanism: the check read nothing"
    assert not wrong, "\n".join(wrong)
