"""Findings at a glance: the README's block of what each judged library breaks, and what to do about it.

    python -m ckptspec.report.glance conformance/all/*.json --update README.md

replaces the block between `<!-- glance:start -->` and `<!-- glance:end -->` with, for each library that has a
stored run (NVRx, Megatron-Core, torch DCP, torchtitan, Lightning; impl has no findings): its releases' findings
pages and verdict counts; a table of the clauses a release breaks as documented or implied, ordered by severity
(data-loss, hang, leak, wrong-error, cosmetic), documented before implied, each with the clause's `symptom`, the
releases that break it and a standalone reproducer where one exists; the clauses met only at their weak level; the
decisions of this spec the releases do not meet, apart (the library never promised them); and the usage rules of
`findings/advice.toml` that apply (ckptspec.report.advice). Everything comes from the stored runs, the clauses
and the advice file (python regenerate.py; CI checks it for drift).
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckptspec.report import advice, findings, verdicts
from ckptspec.report import clauses as clause_registry
from ckptspec.report.blocks import markers, write_block
from ckptspec.report.report import clause_verdict
from ckptspec.report.runs import REPO_ROOT, ReportError, Run, load_run, page_name

__all__ = ["main", "render", "repro_path", "symptom"]

SEVERITIES = findings.SEVERITIES
FINDINGS_DIR = "docs/findings"
_BREAKS = (verdicts.BROKEN_WORDS["documented"], verdicts.BROKEN_WORDS["implied"])
_STRICTER = verdicts.BROKEN_WORDS["decision"]
_BASIS_OF_WORD = {word: basis for basis, word in verdicts.BROKEN_WORDS.items()}


def symptom(clause: Mapping[str, Any]) -> str:
    """What a user sees when the clause breaks (its `symptom`; its statement for a clause recorded without one)."""
    return str(clause.get("symptom") or clause.get("statement", ""))


def repro_path(run: Run, clause_id: str, root: Path = REPO_ROOT) -> str | None:
    """The standalone reproducer that shows a clause's break on a run's release (its own, or its weak level's:
    findings.shown_by), relative to the repository root, if one exists."""
    shown = findings.shown_by(run, clause_id, clause_registry.load(), root)
    return str(shown[0]) if shown else None


def release_of(run: Run) -> str:
    """The run's release as a reader names it within its library: `0.7.0`, or `thread 2.15.0` for dcp-thread on
    torch 2.15.0 (a library judged in several configurations, each on its own version)."""
    target, _, version = run.label.partition(" ")
    key = advice.library_of(run)
    if key is None or advice.LIBRARIES[key][1] == (target,) or target == key:
        return version  # a library's one target, or its default configuration named after it (deepspeed)
    return f"{target.removeprefix(f'{key}-')} {version.split('+', 1)[0]}"


def _severity(runs: Sequence[Run], cid: str, clause: Mapping[str, Any]) -> str:
    """The worst severity of the clause among `runs` (each run's expectations entry may say its own)."""
    return min((str(run.severity(cid, clause.get("severity", ""))) for run in runs), key=findings.severity_rank)


def _counts(run: Run, judged: Mapping[str, verdicts.Verdict]) -> str:
    counts = Counter(v.word for v in judged.values())
    parts = [
        f"passes {counts[verdicts.PASSES]}",
        f"breaks {counts[_BREAKS[0]]} documented",
        f"misses {counts[_BREAKS[1]]} implied",
        f"weak level only {counts[verdicts.WEAK_ONLY]}",
        f"stricter than documented {counts[_STRICTER]}",
    ]
    some_runs = sum(1 for v in judged.values() if v.intermittent)
    parts += [f"fails on some runs {some_runs}"] if some_runs else []
    return f"{release_of(run)}: " + ", ".join(parts)


def _library(
    key: str, runs: Sequence[Run], registry: Mapping[str, Mapping[str, Any]], rules: Sequence[advice.Rule], root: Path
) -> list[str]:
    name = advice.LIBRARIES[key][0]
    judged = {run.label: {cid: clause_verdict(run, cid, registry) for cid in registry} for run in runs}
    pages = ", ".join(f"[{release_of(run)}]({FINDINGS_DIR}/{page_name(run)}.md)" for run in runs)
    shared = sorted({run.label.partition(" ")[2] for run in runs if release_of(run) != run.label.partition(" ")[2]})
    # DCP's configurations are versioned by torch; another library's configurations share its own version.
    version = f"; torch {', '.join(shared)}" if shared and key == "dcp" else ""
    lines = [f"**{name}** (findings: {pages}{version}). Clauses judged on each release: "]
    lines[0] += "; ".join(_counts(run, judged[run.label]) for run in runs) + "."
    broken_on = {cid: [run for run in runs if _listed(judged[run.label][cid], registry[cid])] for cid in registry}
    breaks = sorted(
        (cid for cid, on in broken_on.items() if on),
        key=lambda cid: (
            findings.severity_rank(_severity(broken_on[cid], cid, registry[cid])),
            verdicts.basis_of(registry[cid]) != "documented",
            cid,
        ),
    )
    lines += [
        "",
        "| severity | what goes wrong | clause | basis | releases | reproducer |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for cid in breaks:
        repros = [(run, path) for run in broken_on[cid] if (path := repro_path(run, cid, root))]
        repro = ", ".join(f"[{release_of(run)}]({path})" for run, path in repros) or "not yet written"
        cells = [
            _severity(broken_on[cid], cid, registry[cid]),
            symptom(registry[cid]),
            cid,
            _basis(cid, registry[cid], [judged[run.label][cid] for run in broken_on[cid]]),
            ", ".join(_release_cell(run, judged[run.label][cid]) for run in broken_on[cid]),
            repro,
        ]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    if not breaks:
        lines.append("| | none | | | | |")
    lines += [
        "",
        *_apart(runs, judged, registry),
        "",
        "What to do (each rule in full, with its safe alternative, on the findings pages):",
        "",
    ]
    applying = [(rule, [run for run in runs if advice.applies(rule, run, registry)]) for rule in rules]
    for rule, on in applying:
        if on:
            cids = sorted({cid for run in on for cid in advice.applies(rule, run, registry)})
            releases = ", ".join(release_of(run) for run in on)
            lines.append(f"- {rule.rule} ({', '.join(cids)}; {releases}).")
    if not any(on for _, on in applying):
        lines.append("- nothing beyond the library's own documentation.")
    return [*lines, ""]


def _basis(cid: str, clause: Mapping[str, Any], judged: Sequence[verdicts.Verdict]) -> str:
    """The basis the releases' verdicts say (an expectations entry may judge a documented clause as an implied rule
    for its target, verdict "implied"), else the clause's."""
    said = {_BASIS_OF_WORD.get(v.word, verdicts.basis_of(clause)) for v in judged}
    return ", ".join(sorted(said)) if said else verdicts.basis_of(clause)


def _listed(verdict: verdicts.Verdict, clause: Mapping[str, Any]) -> bool:
    """Whether the table of breaks lists the verdict: a documented or implied break, or a documented or implied
    clause failing on some runs (an intermittent entry, at the severity of its symptom)."""
    return verdict.word in _BREAKS or (verdict.intermittent and verdicts.basis_of(clause) != "decision")


def _release_cell(run: Run, verdict: verdicts.Verdict) -> str:
    return f"{release_of(run)} ({verdict.word})" if verdict.intermittent else release_of(run)


def _apart(
    runs: Sequence[Run], judged: Mapping[str, Mapping[str, verdicts.Verdict]], registry: Mapping[str, Any]
) -> list[str]:
    """The weak-level-only line and the decisions line (ids grouped by their severity on these releases; a decision
    failing on some runs says so, with the releases)."""
    lines = []
    for words, title in (
        ((verdicts.WEAK_ONLY,), "Meets only the weak level of"),
        (
            (_STRICTER, verdicts.SOME_RUNS),
            "Does not meet these decisions of this spec (stricter than documented, not promises of the library)",
        ),
    ):
        on = {
            cid: [run for run in runs if judged[run.label][cid].word.startswith(words)]
            for cid in registry
            if verdicts.basis_of(registry[cid]) == "decision" or words == (verdicts.WEAK_ONLY,)
        }
        on = {cid: found for cid, found in on.items() if found}
        severity = {cid: _severity(found, cid, registry[cid]) for cid, found in on.items()}
        groups = [
            f"{level}: {', '.join(_decision(cid, on[cid], judged) for cid in sorted(on) if severity[cid] == level)}"
            for level in SEVERITIES
            if level in severity.values()
        ]
        if groups:
            lines.append(f"{title}: {'; '.join(groups)}.")
    return lines


def _decision(cid: str, on: Sequence[Run], judged: Mapping[str, Mapping[str, verdicts.Verdict]]) -> str:
    some = [run for run in on if judged[run.label][cid].intermittent]
    cells = ", ".join(f"{judged[run.label][cid].word} on {release_of(run)}" for run in some)
    return f"{cid} ({cells})" if some else cid


def render(
    runs: Sequence[Run], registry: Mapping[str, Mapping[str, Any]], rules: Sequence[advice.Rule], root: Path = REPO_ROOT
) -> str:
    """The block's Markdown (ends with a newline): one part per library with a stored run, in LIBRARIES order."""
    lines: list[str] = []
    for key in advice.LIBRARIES:
        mine = [run for run in runs if advice.library_of(run) == key]
        if mine:
            lines += _library(key, mine, registry, rules, root)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptspec.report.glance", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, metavar="JSON", help="stored runs (conformance/all/*.json)")
    parser.add_argument("--update", type=Path, required=True, metavar="FILE", help="the file holding the glance block")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(path) for path in args.files]
        registry = clause_registry.load()
        known = {**{cid: entry for run in runs for cid, entry in run.clauses.items()}, **registry}
        block = render(runs, known, advice.load(known))
        write_block(block, args.update, *markers("glance"))
    except ReportError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
