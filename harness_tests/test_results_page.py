"""The results page (docs/results.html): its contents from a hand-written run, and its filters in headless Chromium.

The browser test opens the committed page (kept equal to its data by `python regenerate.py --check`) with
Debian's `chromium --headless --dump-dom`, the filters set from the address as the page allows, and reads back which
rows and columns the page's own script left shown. It skips, saying why, where no Chromium is installed.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

from ckptspec.report import clauses as clause_registry
from ckptspec.report import results_page, verdicts
from ckptspec.report.report import clause_verdict, main
from ckptspec.report.runs import REPO_ROOT, load_run

PAGE = REPO_ROOT / "docs" / "results.html"
BROWSER = shutil.which("chromium") or shutil.which("chromium-browser")


def _run_file(tmp_path: Path) -> Path:
    """A run of impl where AR-5's test is a known failure charged to AR-5 and AR-1's test passed."""
    tests = [
        {"nodeid": "t.py::a", "outcome": "passed", "when": "call", "clauses": ["AR-1"], "duration": 0.1, "message": ""},
        {
            "nodeid": "t.py::b",
            "outcome": "xfail",
            "when": "call",
            "clauses": ["AR-5"],
            "duration": 0.1,
            "message": "[AR-5] freeze shares the list",
            "entry": {"clauses": ["AR-5"], "verdict": None, "intermittent": None},
        },
    ]
    path = tmp_path / "impl.json"
    registry = clause_registry.load()
    path.write_text(
        json.dumps(
            {"target": "impl", "version": "(source tree)", "capabilities": [], "clauses": registry, "tests": tests}
        )
    )
    return path


def test_every_clause_is_a_row_and_a_broken_cell_links_to_its_finding(tmp_path):
    run = load_run(_run_file(tmp_path))
    page = results_page.render([run], clause_verdict)
    rows = re.findall(r'<tr data-clause="([^"]+)"', page)
    assert rows == list(clause_registry.load()), "one row per clause, in registry order"
    link = 'href="findings/impl-source-tree.html#clause-ar-5"'
    assert link in page, "the broken AR-5 cell links to its place on the findings page"
    assert 'data-word="passes" data-colour="pass">passes</td>' in page
    assert not re.search(r"<(script|link|img)[^>]+(src|href)=", page), "self-contained: nothing loaded from elsewhere"


class _Links(HTMLParser):
    """Every href of a page and every id it defines."""

    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []
        self.ids: set[str] = set()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if a.get("href"):
            self.hrefs.append(a["href"])
        if a.get("id"):
            self.ids.add(a["id"])


def _links(path: Path) -> _Links:
    parser = _Links()
    parser.feed(path.read_text())
    return parser


def test_every_link_of_the_results_page_and_its_findings_pages_reaches_what_it_names():
    """Each cell's link names a findings page that exists and a place on it that exists (the committed pages, kept
    equal to their data by regenerate.py --check), and so does every link of those pages into the repository."""
    pages = [PAGE, *sorted((PAGE.parent / "findings").glob("*.html"))]
    broken, checked = [], 0
    for page in pages:
        for href in _links(page).hrefs:
            if href.startswith(("http://", "https://")):
                continue
            file, _, fragment = href.partition("#")
            target = (page.parent / file).resolve() if file else page
            checked += 1
            if not target.exists():
                broken.append(f"{page.name}: {href} (no such file)")
            elif fragment and target.suffix == ".html" and fragment not in _links(target).ids:
                broken.append(f"{page.name}: {href} (no such place on the page)")
    assert checked > 100, "the pages link to their findings"
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_verdict_word_has_a_colour_in_the_legend():
    words = [
        *verdicts.BROKEN_WORDS.values(),
        verdicts.PASSES,
        verdicts.WEAK_ONLY,
        verdicts.API_CHANGED,
        verdicts.DOCUMENTED_OTHERWISE,
        verdicts.UNEXPECTED,
        verdicts.NOT_RUN_GPU,
        "not applicable (lacks storage_writer)",
        verdicts.SKIPPED,
        verdicts.NOT_JUDGED,
        verdicts.NOT_SET_UP,
        verdicts.NOT_COVERED,
        verdicts.SOME_RUNS,
    ]
    legend = PAGE.read_text().split('<ul id="legend">', 1)[1].split("</ul>", 1)[0]
    for word in words:
        colour = results_page.colour(word)
        shown = word if not word.startswith("not applicable (lacks") else "not applicable (lacks"
        shown = "fails k of n runs" if word == verdicts.SOME_RUNS else shown
        assert f'class="swatch {colour}"' in legend, f"no swatch of the colour of {word!r}"
        assert html.escape(shown) in legend, f"{word!r} is not in the legend"


def test_an_intermittent_pass_looks_different_from_a_pass(tmp_path):
    path = _run_file(tmp_path)
    data = json.loads(path.read_text())
    data["tests"][0] = {
        **data["tests"][0],
        "outcome": "xpass",
        "entry": {"clauses": ["AR-1"], "verdict": None, "intermittent": "failed 1 of 3 runs"},
    }
    path.write_text(json.dumps(data))
    page = results_page.render([load_run(path)], clause_verdict)
    row = page.split('<tr data-clause="AR-1"', 1)[1].split("</tr>", 1)[0]
    assert 'class="sometimes intermittent"' in row, row
    assert ">fails 1 of 3 runs<" in row, "an intermittent entry's pass reads as the failures it had, not as a pass"


def test_the_report_command_writes_the_page(tmp_path):
    out = tmp_path / "results.html"
    assert main([str(_run_file(tmp_path)), "--html", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")


def test_slug_is_the_anchor_of_a_findings_heading():
    heading = "AR-7 (data-loss): misses an implied rule (1 of 4 tests; CPU tensors)"
    assert results_page.slug(heading) == "ar-7-data-loss-misses-an-implied-rule-1-of-4-tests-cpu-tensors"


class _Rows(HTMLParser):
    """Each table row's clause, whether hidden, and its cells' (target, verdict word, hidden)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[dict] = []
        self.heads: dict[str, bool] = {}  # target -> column head hidden
        self.shown = ""
        self._in_shown = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "tr" and "data-clause" in a:
            row = {"clause": a["data-clause"], "area": a["data-area"], "severity": a["data-severity"]}
            self.rows.append({**row, "hidden": "hidden" in a, "cells": []})
        elif tag == "td" and "data-target" in a and self.rows:
            self.rows[-1]["cells"].append((a["data-target"], a["data-word"], "hidden" in a))
            self.rows[-1].setdefault("colours", {})[a["data-target"]] = a.get("data-colour")
        elif tag == "th" and "data-target" in a:
            self.heads[a["data-target"]] = "hidden" in a
        self._in_shown = tag == "span" and a.get("id") == "shown"

    def handle_endtag(self, tag):
        self._in_shown = False

    def handle_data(self, data):
        if self._in_shown:
            self.shown += data


def _parse(text: str) -> _Rows:
    parser = _Rows()
    parser.feed(text)
    return parser


def _open(tmp_path: Path, fragment: str) -> _Rows:
    """The page's DOM after its script ran, with the filters of `fragment` set."""
    assert BROWSER is not None
    command = [
        BROWSER,
        "--headless",
        "--no-sandbox",  # the test may run as root (CI containers)
        "--disable-gpu",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--dump-dom",
        f"{PAGE.as_uri()}#{fragment}",
    ]
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"chromium exited with {done.returncode}: {done.stderr[-2000:]}"
    return _parse(done.stdout)


@pytest.mark.skipif(BROWSER is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
def test_the_page_filters_by_target_and_verdict_in_a_browser(tmp_path):
    static = _parse(PAGE.read_text())
    assert static.rows, "without filters every row is shown"
    assert not any(row["hidden"] for row in static.rows), "without filters every row is shown"
    target, word = "nvrx-0.7.0", "breaks its documentation"
    expected = [row["clause"] for row in static.rows if any(t == target and w == word for t, w, _ in row["cells"])]
    assert expected, f"the stored runs hold no '{word}' for {target}: choose another filter for this test"

    shown = _open(tmp_path, f"target={target}&verdict={word.replace(' ', '+')}")
    assert [row["clause"] for row in shown.rows if not row["hidden"]] == expected
    assert {t for t, hidden in shown.heads.items() if not hidden} == {target}, "only the chosen target's column"
    assert all(hidden == (t != target) for row in shown.rows for t, _, hidden in row["cells"])
    assert shown.shown == f"{len(expected)} of {len(static.rows)} clauses shown"

    hangs = [row["clause"] for row in static.rows if (row["area"], row["severity"]) == ("protocol", "hang")]
    severe = _open(tmp_path, "area=protocol&severity=hang")
    assert hangs, "two filters together"
    assert [row["clause"] for row in severe.rows if not row["hidden"]] == hangs, "two filters together"


@pytest.mark.skipif(BROWSER is None, reason="no chromium on PATH (Debian: apt-get install chromium)")
def test_a_literal_plus_and_the_judged_and_failing_boxes_in_a_browser(tmp_path):
    """`#target=dcp-thread-2.13.0+cpu` keeps its `+` (not read as a space); judged=1 keeps the rows where the shown
    column judges the clause; failing=1 those where it breaks, misses or fails on some runs."""
    static = _parse(PAGE.read_text())
    target = "dcp-thread-2.13.0+cpu"
    assert target in static.heads, "the stored runs hold dcp-thread 2.13.0+cpu: choose another target for this test"
    judged = [row["clause"] for row in static.rows if row["colours"][target] != "unjudged"]
    failing = [row["clause"] for row in static.rows if row["colours"][target] in results_page.FAILING]
    assert failing, f"{target} fails no clause: choose another target for this test"
    assert len(failing) < len(judged) < len(static.rows), "each box narrows the rows"

    shown = _open(tmp_path, f"target={target}&judged=1")
    assert {t for t, hidden in shown.heads.items() if not hidden} == {target}, "the + is literal: the target is set"
    assert [row["clause"] for row in shown.rows if not row["hidden"]] == judged
    failing_shown = _open(tmp_path, f"target={target}&failing=1")
    assert [row["clause"] for row in failing_shown.rows if not row["hidden"]] == failing
