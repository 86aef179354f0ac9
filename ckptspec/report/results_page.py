"""The results page: one self-contained HTML file of every clause against every stored run, with filters.

    python -m ckptspec.report.report conformance/all/*.json --html docs/results.html

The page needs no server, no network and no build step: the table is plain HTML (readable with scripts off), and
a short inline script filters it by target, area, verdict word, severity and basis. Each row shows the clause's
statement in full, its source and the decision on demand (a <details> element); each cell where a target breaks
a clause links to that clause on the target's findings page (docs/findings/, ckptspec.report.findings).

The filters can also be set from the address: `results.html#target=nvrx-0.7.0&verdict=breaks+its+documentation`
sets the controls as a reader would and applies them (the browser test does exactly this), and every change of a
control writes the address back, so a filtered view can be shared as a link.

Rows: every clause of the registry, area by area in table order; a cell's verdict is the one docs/results.md shows
(report.clause_verdict). Row and cell attributes carry what the filters read (data-area, data-severity, data-basis,
data-target, data-word).
"""

from __future__ import annotations

import html
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ckptspec.report import clauses as clause_registry
from ckptspec.report import provenance, verdicts
from ckptspec.report.runs import Run, clause_anchor, page_name

Judge = Callable[[Run, str, Mapping[str, Mapping[str, Any]]], verdicts.Verdict]


def with_severity(run: Run, clause_id: str, verdict: verdicts.Verdict, clause: Mapping[str, Any]) -> verdicts.Verdict:
    """The verdict as a cell of the tables (docs/results.md, this page) shows it: where the run misses the clause with
    a severity of its own (its expectations entry's, as its findings page says), the note names it beside the
    clause's severity column."""
    own = run.severity(clause_id, None)
    if not verdict.missed or not own or own == clause.get("severity"):
        return verdict
    return verdict._replace(note="; ".join(filter(None, [verdict.note, f"severity here: {own}"])))


__all__ = ["render", "slug"]

FINDINGS_DIR = "findings"  # relative to the page, which lives in docs/
GPU_PAGE = "gpu.md"  # the GPU runs' verdicts (docs/gpu.md, from conformance/gpu/<run>/)
GPU_RUNS = "../conformance/gpu/"
# The colours the filter "any failure" keeps a row for: a break, a decision not met or the weak level only, a failure
# on some runs, an unexpected failure (not: passes, another document, not judged).
FAILING = ("break", "stricter", "sometimes", "unexpected")


def slug(heading: str) -> str:
    """The anchor a Markdown renderer (GitHub's) gives a heading: lower case, punctuation dropped, spaces as dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# Where each verdict word is listed on a findings page (findings.page): the cells saying one of these link there.
LISTED = (*verdicts.BROKEN_WORDS.values(), verdicts.WEAK_ONLY, verdicts.API_CHANGED, verdicts.DOCUMENTED_OTHERWISE)
# Every verdict word's colour class: the legend shows each, and a cell's class is its word's (first matching prefix).
COLOURS = (
    ("pass", "passes", (verdicts.PASSES,)),
    (
        "break",
        "breaks a documented or implied promise",
        (verdicts.BROKEN_WORDS["documented"], verdicts.BROKEN_WORDS["implied"]),
    ),
    (
        "stricter",
        "meets less than this spec's decision, or only the weak level",
        (verdicts.BROKEN_WORDS["decision"], verdicts.WEAK_ONLY),
    ),
    (
        "otherwise",
        "judged by the release's own documents or changed API",
        (verdicts.API_CHANGED, verdicts.DOCUMENTED_OTHERWISE),
    ),
    ("sometimes", "fails on some runs: the symptom was seen on k of n recorded runs", (verdicts.SOME_RUNS,)),
    ("unexpected", "fails, and no expectation says so (a regression to look at)", (verdicts.UNEXPECTED,)),
    (
        "unjudged",
        "not judged here",
        (
            verdicts.NOT_RUN_GPU,
            "not applicable (lacks",
            verdicts.NO_MODULE,
            verdicts.SKIPPED,
            verdicts.NOT_JUDGED,
            verdicts.NOT_SET_UP,
            verdicts.NOT_COVERED,
        ),
    ),
)


def colour(word: str) -> str:
    """The colour class of a verdict word (COLOURS)."""
    return next(name for name, _, words in COLOURS if word.startswith(words))


def _cell(run: Run, cid: str, verdict: verdicts.Verdict) -> str:
    text = html.escape(str(verdict))
    if verdict.word in LISTED or verdict.intermittent:
        href = f"{FINDINGS_DIR}/{page_name(run)}.html#{clause_anchor(cid)}"
        text = f'<a href="{html.escape(href)}">{text}</a>'
    elif verdict.word == verdicts.NOT_RUN_GPU:  # the GPU runs' verdicts of the clauses that need one
        text = f'<a href="{GPU_PAGE}">{text}</a>'
    hatched = verdict.intermittent or "intermittent" in verdict.note
    classes = colour(verdict.word) + (" intermittent" if hatched else "")
    word = html.escape(verdict.word)
    return (
        f'<td class="{classes}" data-target="{html.escape(page_name(run))}" data-word="{word}" '
        f'data-colour="{colour(verdict.word)}">{text}</td>'
    )


def _statement(clause: Mapping[str, Any]) -> str:
    parts = [f"<p>{html.escape(str(clause.get('statement', '')))}</p>"]
    if clause.get("source"):
        source = clause_registry.linked_source(
            html.escape(str(clause["source"])),
            lambda number, title, url: f'<a href="{html.escape(url)}" title="{html.escape(title)}">{number}</a>',
        )
        parts.append(f"<p><b>Source:</b> {source}</p>")
    if clause.get("decision"):
        parts.append(f"<p><b>Decision:</b> {html.escape(str(clause['decision']))}</p>")
    short = html.escape(" ".join(str(clause.get("statement", "")).split()[:9]) + " …")
    return f"<details><summary>{short}</summary>{''.join(parts)}</details>"


def _options(name: str, label: str, values: Sequence[str]) -> str:
    options = "".join(f'<option value="{html.escape(v)}">{html.escape(v)}</option>' for v in values)
    return f'<label>{label} <select id="{name}"><option value="">all</option>{options}</select></label>'


def _shown(word: str) -> str:
    """A verdict word as the legend names it ("fails k of n runs" for its prefix)."""
    return "fails k of n runs" if word == verdicts.SOME_RUNS else word


def _box(name: str, label: str) -> str:
    return f'<label><input type="checkbox" id="{name}"> {html.escape(label)}</label>'


def _legend() -> str:
    """Every colour with the verdict words it stands for (COLOURS), then how intermittent passes look."""
    items = "".join(
        f'<li><span class="swatch {name}"></span> {html.escape(meaning)}: '
        + ", ".join(f"<i>{html.escape(_shown(word))}{'…' if word.endswith('(lacks') else ''}</i>" for word in words)
        + "</li>"
        for name, meaning, words in COLOURS
    )
    items += (
        '<li><span class="swatch sometimes intermittent"></span> hatched: the symptom is seen on some runs only '
        "(an intermittent race or hang: <i>fails k of n runs</i>, or a break with <i>intermittent: failed k of n "
        "runs</i>)</li>"
    )
    return f'<ul id="legend">{items}</ul>'


def _summary(runs: Sequence[Run], counts: Mapping[str, Counter[str]]) -> str:
    """One row per target: how many clauses it says each colour of verdict for, and its findings page."""
    heads = "".join(f'<th><span class="swatch {name}"></span> {name}</th>' for name, _, _ in COLOURS)
    rows = "".join(
        f'<tr data-target="{html.escape(page_name(r))}"><th scope="row">'
        f'<a href="{FINDINGS_DIR}/{html.escape(page_name(r))}.html">{html.escape(r.label)}</a></th>'
        + "".join(f"<td>{counts[r.label][name]}</td>" for name, _, _ in COLOURS)
        + "</tr>"
        for r in runs
    )
    return f'<table id="summary"><thead><tr><th>target</th>{heads}</tr></thead><tbody>{rows}</tbody></table>'


def render(runs: Sequence[Run], clause_verdict: Judge) -> str:
    """The whole page (ends with a newline); `clause_verdict` is report.clause_verdict (passed in: report imports
    this module)."""
    registry = clause_registry.load()
    known = {**{c: e for r in runs for c, e in r.clauses.items()}, **registry}
    rows: list[str] = []
    words: set[str] = set()
    counts: dict[str, Counter[str]] = {r.label: Counter() for r in runs}
    for area in clause_registry.AREAS:
        for cid, clause in clause_registry.load((area,)).items():
            judged = [with_severity(run, cid, clause_verdict(run, cid, known), clause) for run in runs]
            words.update(v.word for v in judged)
            for run, verdict in zip(runs, judged, strict=True):
                counts[run.label][colour(verdict.word)] += 1
            cells = "".join(_cell(r, cid, v) for r, v in zip(runs, judged, strict=True))
            basis, severity = verdicts.basis_of(clause), str(clause.get("severity", ""))
            rows.append(
                f'<tr data-clause="{html.escape(cid)}" data-area="{area}" data-severity="{html.escape(severity)}" '
                f'data-basis="{basis}"><th scope="row">{html.escape(cid)}</th><td>{_statement(clause)}</td>'
                f"<td>{area}</td><td>{basis}</td><td>{html.escape(severity)}</td>{cells}</tr>"
            )
    heads = "".join(f'<th data-target="{html.escape(page_name(r))}">{html.escape(r.label)}</th>' for r in runs)
    filters = "".join(
        [
            _options("target", "Target", [page_name(r) for r in runs]),
            _options("area", "Area", list(clause_registry.AREAS)),
            _options("verdict", "Verdict", sorted(words)),
            _options("severity", "Severity", list(clause_registry.SEVERITIES)),
            _options("basis", "Basis", ["documented", "implied", "decision"]),
            _box("judged", "judged only (a shown cell is not 'not applicable', skipped or not run)"),
            _box("failing", "any failure (a shown cell breaks, misses or fails on some runs)"),
        ]
    )
    devices = ", ".join(sorted({run.tensor_device for run in runs}))
    return _PAGE.format(
        filters=filters,
        heads=heads,
        rows="\n".join(rows),
        legend=_legend(),
        seeds="; ".join(
            f'<a href="{html.escape(url)}">{number}</a>: {html.escape(title)}'
            for number, (title, url) in clause_registry.SEEDS.items()
        ),
        summary=_summary(runs, counts),
        devices=devices,
        total=len(rows),
        provenance=_provenance(runs),
        script=_SCRIPT,
        gpu_page=GPU_PAGE,
        gpu_runs=GPU_RUNS,
    )


def _provenance(runs: Sequence[Run]) -> str:
    """Where each run came from: one list item per provenance part (ckptspec.report.provenance)."""
    items = [
        f"<li>{html.escape(provenance.describe(part).replace('`', ''))}</li>"
        for run in runs
        for part in run.provenance or [{"target": run.label, "version": "(no provenance recorded)"}]
    ]
    return "<ul>\n" + "\n".join(items) + "\n</ul>"


_PAGE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>ckptspec: conformance results</title>
<!-- Generated by python regenerate.py from conformance/all/*.json: do not edit. -->
<style>
body {{ font: 14px/1.4 system-ui, sans-serif; margin: 1em; }}
#filters label {{ margin-right: 1em; }}
table {{ border-collapse: collapse; margin-top: 1em; }}
th, td {{ border: 1px solid #ccc; padding: 3px 6px; vertical-align: top; text-align: left; }}
thead th {{ position: sticky; top: 0; background: #eee; z-index: 2; }}
#results tbody th {{ position: sticky; left: 0; background: #fafafa; z-index: 1; }}
#results thead th:first-child {{ left: 0; z-index: 3; }}
.pass {{ background: #e6f4e6; }}
.break {{ background: #fbe3e3; }}
.stricter {{ background: #fff3d6; }}
.otherwise {{ background: #e3ecfb; }}
.unexpected {{ background: #d9534f; color: #fff; font-weight: bold; }}
.unjudged {{ background: #fff; color: #666; }}
.sometimes {{ background: #fbe3e3; }}
.intermittent {{ background-image: repeating-linear-gradient(45deg, transparent 0 6px, #f0a0a0 6px 8px); }}
.swatch {{ display: inline-block; width: 1.2em; height: 0.9em; border: 1px solid #999; vertical-align: middle; }}
#legend {{ columns: 2; max-width: 80em; }}
details summary {{ cursor: pointer; }}
details p {{ max-width: 40em; margin: 0.3em 0; }}
</style>
</head>
<body>
<h1>ckptspec: every clause against every stored run</h1>
<p>Measured with {devices} tensors (gloo) on a 2-core CPU machine; no verdict here was measured on a GPU: the
GPU runs' verdicts are in <a href="{gpu_page}">gpu.md</a> (the runs: <a href="{gpu_runs}">conformance/gpu/</a>), and
each cell "not run here (GPU)" links there.
Click a statement for its source and the decision behind it; a coloured cell that names a break, a decision, a weak
level or another document links to the clause on the target's findings page. "(k of n tests)": only k of the n
tests judging the clause say so; a failure counts only against the clauses its expectations entry names.
A source cites the documents by number: {seeds}.</p>
{legend}
<h2>By target</h2>
{summary}
<h2>By clause</h2>
<p>The filters below can be set from the address, and each change writes it back, so a filtered view is a link
to share: <code>results.html#target=nvrx-0.7.0&amp;verdict=breaks+its+documentation</code>, or
<code>#area=protocol&amp;severity=hang</code>, or <code>#target=dcp-thread-2.13.0+cpu&amp;judged=1</code>
(keys: target, area, verdict, severity, basis; judged=1 and failing=1 for the two boxes; a <code>+</code> is
literal where an option has one, else a space).</p>
<form id="filters">{filters} <span id="shown">{total} of {total} clauses shown</span></form>
<table id="results">
<thead><tr><th>clause</th><th>statement</th><th>area</th><th>basis</th><th>severity</th>{heads}</tr></thead>
<tbody>
{rows}
</tbody>
</table>
<h2>Where each run came from</h2>
{provenance}
<script>
{script}
</script>
</body>
</html>
"""

_SCRIPT = """
"use strict";
const KEYS = ["target", "area", "verdict", "severity", "basis"];
const BOXES = ["judged", "failing"];
const FAILING = %s;
const control = (key) => document.getElementById(key);
function apply() {
  const want = Object.fromEntries(KEYS.map((k) => [k, control(k).value]));
  const box = Object.fromEntries(BOXES.map((k) => [k, control(k).checked]));
  document.querySelectorAll("[data-target]").forEach((el) => {
    el.hidden = want.target !== "" && el.dataset.target !== want.target;
  });
  const rows = document.querySelectorAll("#results tbody tr");
  let shown = 0;
  rows.forEach((row) => {
    const cells = [...row.querySelectorAll("td[data-target]")].filter((td) => !td.hidden);
    const ok = (want.area === "" || row.dataset.area === want.area)
      && (want.severity === "" || row.dataset.severity === want.severity)
      && (want.basis === "" || row.dataset.basis === want.basis)
      && (want.verdict === "" || cells.some((td) => td.dataset.word === want.verdict))
      && (!box.judged || cells.some((td) => td.dataset.colour !== "unjudged"))
      && (!box.failing || cells.some((td) => FAILING.includes(td.dataset.colour)));
    row.hidden = !ok;
    shown += ok ? 1 : 0;
  });
  control("shown").textContent = shown + " of " + rows.length + " clauses shown";
  const parts = KEYS.filter((k) => want[k] !== "").map((k) => k + "=" + encodeURIComponent(want[k]));
  parts.push(...BOXES.filter((k) => box[k]).map((k) => k + "=1"));
  history.replaceState(null, "", parts.length ? "#" + parts.join("&") : location.pathname);
}
[...KEYS, ...BOXES].forEach((key) => control(key).addEventListener("change", apply));
// The address's filters, read by hand: URLSearchParams would read every "+" as a space, and a target such as
// dcp-thread-2.13.0+cpu has one. A "+" is literal where an option has the value so, else a space (a shared link
// writes spaces as %%20, a hand-typed one as +).
const given = new Map(location.hash.slice(1).split("&").filter((p) => p.includes("=")).map((p) => {
  const at = p.indexOf("=");
  const decode = (text) => { try { return decodeURIComponent(text); } catch (e) { return text; } };
  return [decode(p.slice(0, at)), decode(p.slice(at + 1))];
}));
let changed = false;
KEYS.forEach((key) => {
  if (!given.has(key)) return;
  const raw = given.get(key);
  const values = [...control(key).options].map((o) => o.value);
  control(key).value = values.includes(raw) ? raw : raw.replaceAll("+", " ");
  changed = true;
});
BOXES.forEach((key) => {
  if (given.has(key) && given.get(key) !== "" && given.get(key) !== "0") {
    control(key).checked = true;
    changed = true;
  }
});
if (changed) apply();
""" % ("[" + ", ".join(f'"{name}"' for name in FAILING) + "]")
