"""Findings pages: for one recorded run of a target release, what it breaks, for its maintainers.

    python -m ckptspec.report.findings conformance/all/nvrx-0.7.0.json ... --out docs/findings

writes docs/findings/<target>-<release>.md per run (the file name is the run's label, spaces as dashes). A page lists
the clauses the run breaks, documented and implied first, each group ordered by severity (data-loss, hang, leak,
wrong-error, cosmetic): the clause's statement, its basis and quoted source, the mechanism (the reason of the
target's expectations entry, read in the release's source), the tests that show it, and the standalone reproducer
`findings/repro/<target>-<release>/<clause>.py` where one exists, and beside it, for a data-loss or hang break,
the maintainer report `<clause>.md` (ckptspec.report.repro_reports; `reportable` says which breaks get one). Then, in one short list, the clauses where the
target meets less than a decision of this spec asks (not promises of the library), and the clauses judged with
the release's own documents or changed API. Pages are generated (python regenerate.py); edit the clauses, the
expectations files or the runs, never the pages.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckptspec.report import advice, changes, provenance, releases, verdicts
from ckptspec.report import clauses as clause_registry
from ckptspec.report.findings_html import to_html
from ckptspec.report.report import clause_verdict
from ckptspec.report.runs import REPO_ROOT, ReportError, Run, clause_anchor, load_run, page_name, stored_runs

__all__ = [
    "REPORTED_SEVERITIES",
    "SEVERITIES",
    "main",
    "mechanisms",
    "page",
    "page_name",
    "report_path",
    "reportable",
    "repro_path",
    "severity_rank",
    "shared_mechanism",
    "tests_showing",
]

SEVERITIES = ("data-loss", "hang", "leak", "wrong-error", "cosmetic")
REPORTED_SEVERITIES = ("data-loss", "hang")  # the breaks that get a maintainer report beside their reproducer
REPRO_DIR = "findings/repro"
_PREFIX = re.compile(r"^\[[^\]]*\]\s*")
_NOT_STRICT = re.compile(r"\s*\(not strict: [^)]*\)$")
# A reason that opens "FI-STORAGE-1's mechanism:" says its failure is that clause's mechanism, charged there.
_SHARED = re.compile(r"^(?P<clause>[A-Z][A-Z0-9]*(?:-[A-Z0-9]+)+)'s mechanism:")


def _anchored(clause_id: str) -> str:
    return f'<a id="{clause_anchor(clause_id)}"></a>'


def mechanisms(run: Run, clause_id: str) -> list[str]:
    """The reasons of the expectations entries charged with `clause_id` in `run` (read in the release's code)."""
    reasons = (
        _NOT_STRICT.sub("", _PREFIX.sub("", record.message)).strip()
        for record in run.citing(clause_id)
        if record.outcome in ("xfail", "xpass") and clause_id in record.charged
    )
    return list(dict.fromkeys(reason for reason in reasons if reason))


def _failing_first(run: Run, clause_id: str) -> str:
    """Why `clause_id` is not judged: the clauses its tests' entries charge instead, or its own entries' reasons
    (verdict `blocked`: each names the clause whose break every save meets first)."""
    others = sorted(
        {c for r in run.citing(clause_id) if r.outcome in ("xfail", "xpass") for c in r.charged if c != clause_id}
    )
    return "; ".join(mechanisms(run, clause_id)) or ", ".join(others)


def shared_mechanism(run: Run, clause_id: str) -> str | None:
    """The clause whose mechanism every expectations entry charged with `clause_id` in `run` names as its own (each
    reason opens "<CLAUSE>'s mechanism:"), where the run charges that clause too: one mechanism, one verdict and one
    report, that clause's. None otherwise."""
    named = {m["clause"] if (m := _SHARED.match(reason)) else "" for reason in mechanisms(run, clause_id)}
    if len(named) != 1 or "" in named:
        return None
    (other,) = named
    return str(other) if other != clause_id and tests_showing(run, other) else None


def tests_showing(run: Run, clause_id: str) -> list[str]:
    """The node ids of `run`'s expected failures charged with `clause_id`."""
    return sorted(n for n, r in run.tests.items() if r.outcome == "xfail" and clause_id in r.charged)


def _weak_level(run: Run, cid: str, clause: Mapping[str, Any], registry: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the release still keeps of a strict data-loss or hang clause it breaks: its weak level's verdict, or
    why none applies, or that none is written yet (an expected failure could then hide a worse one)."""
    if _severity(run, cid, clause) not in ("data-loss", "hang") or clause.get("weakens"):
        return []
    weak = clause_registry.weak_levels(registry).get(cid)
    if weak is not None:
        return [f"- **Weak level**: {weak}: {clause_verdict(run, weak, registry)}"]
    if clause.get("no_weak_level"):
        return [f"- **Weak level**: none applies: {clause['no_weak_level']}"]
    return ["- **Weak level**: none yet (what the release still keeps here is not judged)"]


def repro_path(run: Run, clause_id: str) -> Path:
    """The standalone reproducer of `clause_id` on `run`'s release, relative to the repository root."""
    return Path(REPRO_DIR) / page_name(run) / f"{clause_id}.py"


def shown_by(
    run: Run, clause_id: str, registry: Mapping[str, Mapping[str, Any]], root: Path = REPO_ROOT
) -> tuple[Path, str] | None:
    """The reproducer that shows `run`'s break of `clause_id`, and the clause it was written for: the clause's own,
    or, where it has none and the run breaks the clause's weak level too, the weak level's (one mechanism, one
    reproducer and one report: breaking the weak level breaks the strict clause). None if neither exists."""
    own = repro_path(run, clause_id)
    if (root / own).exists():
        return own, clause_id
    weak = clause_registry.weak_levels(registry).get(clause_id)
    if weak is None or weak not in registry or not clause_verdict(run, weak, registry).broken:
        return None
    theirs = repro_path(run, weak)
    return (theirs, weak) if (root / theirs).exists() else None


def report_path(run: Run, clause_id: str) -> Path:
    """The maintainer report beside that reproducer, relative to the repository root."""
    return repro_path(run, clause_id).with_suffix(".md")


def reportable(
    run: Run, clause_id: str, clause: Mapping[str, Any], verdict: verdicts.Verdict, root: Path = REPO_ROOT
) -> bool:
    """Whether `run`'s break of a clause gets a maintainer report: a documented or implied clause (not a decision
    of this spec) of severity data-loss or hang that the run breaks, at its strict level at least (where the run
    keeps the weak level, the strict promise is still broken), with a reproducer, and whose mechanism is its own (not
    another charged clause's: `shared_mechanism`)."""
    if verdict.word == verdicts.WEAK_ONLY:  # what its strict tests say, before the weak level is counted
        verdict = verdicts.judge(run.citing(clause_id), clause_id, {clause_id: clause})
    return (
        shared_mechanism(run, clause_id) is None
        and verdict.broken
        and verdict.word != verdicts.BROKEN_WORDS["decision"]
        and _severity(run, clause_id, clause) in REPORTED_SEVERITIES
        and (root / repro_path(run, clause_id)).exists()
    )


def _entry(
    run: Run, cid: str, registry: Mapping[str, Mapping[str, Any]], verdict: verdicts.Verdict, root: Path
) -> list[str]:
    clause = registry[cid]
    repro = repro_path(run, cid)
    lines = [
        _anchored(cid),
        "",
        f"### {cid} ({_severity(run, cid, clause)}): {verdict}",
        "",
        f"- **Clause**: {clause.get('statement', '')}",
        f"- **Basis**: {_basis(clause, verdict)}; source: {clause_registry.markdown_source(str(clause.get('source', '')))}",
    ]
    if clause.get("decision"):
        lines.append(f"- **Decision**: {clause['decision']}")
    lines += _weak_level(run, cid, clause, registry)
    lines += [f"- **Mechanism**: {m}" for m in mechanisms(run, cid)]
    lines += [f"- **Test**: `{t}`" for t in tests_showing(run, cid)]
    shown = shown_by(run, cid, registry, root)
    if shown is None:
        lines.append("- **Reproducer**: not yet written")
        return [*lines, ""]
    if shown[1] != cid:
        lines.append(
            f"- **Reproducer**: its weak level's, [`{shown[0]}`](../../{shown[0]}): the release breaks {shown[1]} too, "
            f"and what that reproducer shows breaks {cid} (the report is {shown[1]}'s)"
        )
        return [*lines, ""]
    lines.append(f"- **Reproducer**: [`{repro}`](../../{repro}) (needs only torch and the library)")
    if reportable(run, cid, clause, verdict, root):
        report = report_path(run, cid)
        lines.append(f"- **Report**: [`{report}`](../../{report}) (ready to file: the promise, the output, the code)")
    return [*lines, ""]


def _report_links(
    run: Run, cid: str, registry: Mapping[str, Mapping[str, Any]], verdict: verdicts.Verdict, root: Path
) -> str:
    """The reproducer and maintainer report of a clause the run keeps only at its weak level, where they exist, or the
    clause whose mechanism its strict break is, where it shares one."""
    other = shared_mechanism(run, cid)
    if other is not None:
        return f"; its strict break is {other}'s mechanism, charged there ([{other}](#{clause_anchor(other)}))"
    if not reportable(run, cid, registry[cid], verdict, root):
        return ""
    repro, report = repro_path(run, cid), report_path(run, cid)
    return f" (strict promise broken: reproducer [`{repro.name}`](../../{repro}), report [`{report.name}`](../../{report}))"


def _what_to_do(
    run: Run, registry: Mapping[str, Mapping[str, Any]], rules: Sequence[advice.Rule], root: Path
) -> list[str]:
    """The usage rules that apply to the run's release, each with its reason, safe way, clauses and reproducers."""
    applying = advice.for_run(rules, run, registry)
    if not applying:
        return []
    lines = [f"## What to do ({len(applying)})", ""]
    for rule, cids in applying:
        judged = ", ".join(f"{cid} ({clause_verdict(run, cid, registry).word})" for cid in cids)
        repros = [Path(REPRO_DIR) / page_name(run) / f"{cid}.py" for cid in cids]
        links = ", ".join(f"[`{p.name}`](../../{p})" for p in repros if (root / p).exists())
        lines += [
            f"- **{rule.rule}.** Otherwise {rule.because}. Instead: {rule.instead}. Clauses: {judged}."
            + (f" Reproducer: {links}." if links else ""),
        ]
    return [*lines, ""]


def page(
    run: Run,
    registry: Mapping[str, Mapping[str, Any]],
    root: Path = REPO_ROOT,
    rules: Sequence[advice.Rule] = (),
    previous: Run | None = None,
) -> str:
    """The Markdown page of one run (ends with a newline); `rules`: the usage rules (findings/advice.toml) whose
    applying ones open the page; `previous`: the run of the target's next older release, whose comparison follows
    them (ckptspec.report.changes)."""
    judged = {cid: clause_verdict(run, cid, registry) for cid in registry}
    decision = {cid for cid in registry if verdicts.basis_of(registry[cid]) == "decision"}
    # A break, or a documented or implied clause failing on some runs (at the severity of its symptom).
    broken = [
        cid
        for cid, v in judged.items()
        if (v.broken and v.word != verdicts.BROKEN_WORDS["decision"]) or (v.intermittent and cid not in decision)
    ]
    broken.sort(
        key=lambda cid: (
            severity_rank(_severity(run, cid, registry[cid])),
            verdicts.basis_of(registry[cid]) != "documented",
        )
    )
    stricter = [
        cid
        for cid, v in judged.items()
        if v.word == verdicts.BROKEN_WORDS["decision"] or (v.intermittent and cid in decision)
    ]
    weak_only = [cid for cid, v in judged.items() if v.word == "weak level only"]
    otherwise = [
        cid for cid, v in judged.items() if v.word in ("API changed in this release", verdicts.DOCUMENTED_OTHERWISE)
    ]
    lines = [
        f"# Findings: {run.label}",
        "",
        "Generated from the stored run `conformance/all/` by `python regenerate.py`: do not edit. Measured on a "
        f"2-core CPU machine with gloo and {run.tensor_device} tensors; clauses that need a GPU were not run.",
        "",
        "Provenance of the stored run (ckptspec.report.provenance; one line per run merged into it):",
        "",
        *(f"- {provenance.describe(part)}" for part in run.provenance),
        *([] if run.provenance else ["- not recorded"]),
        "",
        *_unjudged(run),
        *_what_to_do(run, registry, rules, root),
        *(changes.section(previous, run, registry, clause_verdict) if previous is not None else []),
        f"## Breaks: documented and implied clauses ({len(broken)})",
        "",
    ]
    for cid in broken:
        lines += _entry(run, cid, registry, judged[cid], root)
    if not broken:
        lines += ["None.", ""]
    lines += [f"## Stricter than documented: decisions of this spec it does not meet ({len(stricter)})", ""]
    for cid in stricter:
        weak = " ".join(
            line.removeprefix("- **Weak level**:").strip() for line in _weak_level(run, cid, registry[cid], registry)
        )
        some_runs = f" It {judged[cid].word}: {'; '.join(mechanisms(run, cid))}" if judged[cid].intermittent else ""
        lines.append(
            f"- {_anchored(cid)}{cid} ({_severity(run, cid, registry[cid])}): {registry[cid]['statement']}"
            + some_runs
            + (f" Weak level: {weak}" if weak else "")
        )
    lines += ["", f"## Weak level only ({len(weak_only)})", ""]
    lines += [
        f"- {_anchored(cid)}{cid}: misses the strict clause, meets its weak level"
        + _report_links(run, cid, registry, judged[cid], root)
        for cid in weak_only
    ]
    lines += ["", f"## Judged by the release's own documents or changed API ({len(otherwise)})", ""]
    lines += [f"- {_anchored(cid)}{cid}: {judged[cid]}" for cid in otherwise]
    blocked = [cid for cid, v in judged.items() if v.word == verdicts.NOT_JUDGED]
    if blocked:  # a section only where it has clauses: the other pages stay as they were
        lines += ["", f"## Not judged: their tests fail on another clause ({len(blocked)})", ""]
        lines += [f"- {_anchored(cid)}{cid}: {judged[cid]}: {_failing_first(run, cid)}" for cid in blocked]
    lines += [
        "",
        "## Sources",
        "",
        "The documents a clause's source cites by number:",
        "",
        *clause_registry.seeds_key_markdown(),
    ]
    return "\n".join(lines).rstrip() + "\n"


def _basis(clause: Mapping[str, Any], verdict: verdicts.Verdict) -> str:
    """The clause's basis, and the one its verdict on this release says where an expectations entry judged it
    otherwise (verdict "implied" on a documented clause: the release's own code or messages imply it)."""
    basis = verdicts.basis_of(clause)
    said = next((b for b, word in verdicts.BROKEN_WORDS.items() if word == verdict.word), basis)
    return basis if said == basis else f"{basis} in its source; {said} for this release (its expectations entry)"


def _unjudged(run: Run) -> list[str]:
    """The line saying which configuration of the release the run does not speak for (releases.Release.unjudged)."""
    target, _, version = run.label.partition(" ")
    release = releases.find(target, version)
    return [f"**Not judged**: {release.unjudged}.", ""] if release is not None and release.unjudged else []


def _severity(run: Run, cid: str, clause: Mapping[str, Any]) -> str:
    """The clause's severity for the run's target: its expectations entry's where it says one, else the clause's."""
    return str(run.severity(cid, clause.get("severity", "severity not yet assessed")))


def severity_rank(severity: str) -> int:
    """Where a severity sorts: data-loss first, an unknown one last."""
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptspec.report.findings", description=__doc__.splitlines()[0])
    parser.add_argument(
        "files", nargs="*", type=Path, metavar="JSON", help="runs (default: the stored runs, conformance/all/*.json)"
    )
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help="where the pages go")
    args = parser.parse_args(argv)
    registry = clause_registry.load()
    try:
        runs = [load_run(path) for path in args.files or stored_runs()]
        rules = advice.load(registry)
    except ReportError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    args.out.mkdir(parents=True, exist_ok=True)
    older = changes.predecessors(runs)
    for run in runs:
        text = page(run, registry, rules=rules, previous=older.get(run.label))
        (args.out / f"{page_name(run)}.md").write_text(text)
        (args.out / f"{page_name(run)}.html").write_text(to_html(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
