"""Conformance table: each clause of the registry (`ckptspec/spec/clauses/`) against each target, in verdict words.

Input is the JSON that `pytest ckptspec/spec --impl NAME --conformance-json PATH` writes (ckptspec.report.runs).
Usage:

    python -m ckptspec.report.report A.json B.json ...        print the table to stdout
    python -m ckptspec.report.report A.json --update FILE     replace the block between the lines
                                                                 <!-- conformance:start --> and
                                                                 <!-- conformance:end --> in FILE
    python -m ckptspec.report.report A.json --areas async_ckpt storage
                                                                 only the rows of those clause areas
    python -m ckptspec.report.report --run impl nvrx-0.7.0 [--out DIR] [--suite DIR] [--update FILE]
        first run the suite once per target (a name runs here with pytest; TARGET-RELEASE in its nox session
        `spec(TARGET-RELEASE)`), recording DIR/TARGET.json (DIR defaults to conformance/), then report on those.

    python -m ckptspec.report.report A.json B.json ... --html FILE
                                                                 write the filterable results page
                                                                 (ckptspec.report.results_page) instead

Every generated table and page of the project is regenerated from the stored runs by `python regenerate.py`.

Table contract: one row per clause id, registry order first (a clause no test cites is still a row), then ids only
the input files know; columns clause, statement (shortened to about 70 characters), basis (documented, implied,
decision), severity (what a user suffers when a target misses it), then one column per input file headed
"target version". A cell is ckptspec.report.verdicts.judge's verdict: a failure counts only against the clauses its
expectations entry names. Below the table: the legend and one summary line per target (rows by verdict word). Bad
input (unreadable, not JSON, wrong shape) is an error naming the file; errors exit with status 1.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckptspec.report import clauses as clause_registry
from ckptspec.report import releases, results_page, verdicts
from ckptspec.report.blocks import markers, write_block
from ckptspec.report.runs import Run, cli, load_run, run_parser, run_target

__all__ = ["clause_verdict", "main", "render"]

STATEMENT_WIDTH = 70


def _shorten(text: str, width: int = STATEMENT_WIDTH) -> str:
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text[: width - 1].rsplit(" ", 1)[0]
    return cut.rstrip(",;:") + "…"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _rows(runs: Sequence[Run], registry: Mapping[str, Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Clause id -> its entry: the registry's clauses, then those only the runs know.

    Clauses of the project's registry left out of `registry` (areas not asked for) get no row.
    """
    rows: dict[str, Mapping[str, Any]] = dict(registry)
    left_out = set(clause_registry.load()) - set(registry)
    for run in runs:
        for cid, entry in run.clauses.items():
            if cid not in left_out:
                rows.setdefault(cid, entry)
        for record in run.tests.values():
            for cid in sorted(record.cited - left_out):
                rows.setdefault(cid, {})
    return rows


def _outside_the_release(run: Run, clause_id: str) -> bool:
    """Whether the clause belongs to an area written against NVRx's module paths that `run`'s release is not judged
    on (releases.Release.areas): every test of it skips there as "no such module" (ckptspec.spec.harness.applicability),
    so a clause newer than the stored run is not applicable rather than not covered."""
    target, _, version = run.label.partition(" ")
    release = releases.find(target, version)
    area = clause_registry.area_of(clause_id)
    return release is not None and area in releases.NVRX_AREAS and area not in release.areas


def clause_verdict(run: Run, clause_id: str, registry: Mapping[str, Mapping[str, Any]]) -> verdicts.Verdict:
    """The verdict of `run` on a clause, with the level reached where the clause has a weak level; a clause no test
    of the run cites, in an NVRx area its release is not judged on, is "not applicable (no such module)"."""
    cpu = run.tensor_device == "cpu"
    verdict = verdicts.judge(run.citing(clause_id), clause_id, registry, cpu)
    if verdict.word == verdicts.NOT_COVERED and _outside_the_release(run, clause_id):
        return verdicts.Verdict(verdicts.NO_MODULE)
    weak = clause_registry.weak_levels(registry).get(clause_id)
    if weak is None:
        return verdict
    return verdicts.level(verdict, verdicts.judge(run.citing(weak), weak, registry, cpu))


def _summary(run: Run, cells: Sequence[verdicts.Verdict]) -> str:
    counts = Counter(cell.word for cell in cells)
    listed = "; ".join(f"{word} {count}" for word, count in sorted(counts.items(), key=lambda wc: -wc[1]))
    return f"- **{_md(run.label)}**: {listed}"


def render(runs: Sequence[Run], registry: Mapping[str, Mapping[str, Any]] | None = None) -> str:
    """The Markdown table, legend and per-target summaries (ends with a newline)."""
    known = {**{c: e for r in runs for c, e in r.clauses.items()}, **clause_registry.load()}
    rows = _rows(runs, clause_registry.load() if registry is None else registry)
    header = ["clause", "statement", "basis", "severity", *(run.label for run in runs)]
    lines = ["| " + " | ".join(_md(h) for h in header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    columns: list[list[verdicts.Verdict]] = [[] for _ in runs]
    for cid, entry in rows.items():
        cells = [results_page.with_severity(run, cid, clause_verdict(run, cid, known), entry) for run in runs]
        for column, verdict in zip(columns, cells, strict=True):
            column.append(verdict)
        basis = verdicts.basis_of(entry) if entry else ""
        fixed = [cid, _shorten(str(entry.get("statement", ""))), basis, str(entry.get("severity", ""))]
        lines.append("| " + " | ".join(_md(c) for c in [*fixed, *map(str, cells)]) + " |")
    devices = sorted({run.tensor_device for run in runs})
    lines += ["", verdicts.LEGEND, f"Measured with {', '.join(devices)} tensors (gloo).", ""]
    lines += [_summary(run, column) for run, column in zip(runs, columns, strict=True)]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = run_parser(
        "python -m ckptspec.report.report",
        "Render the clause-by-target conformance table from --conformance-json files.",
        what="the suite",
        written="TARGET.json",
        update_help="replace the block --block NAME (<!-- NAME:start --> ... <!-- NAME:end -->) in FILE instead of printing",
    )
    parser.add_argument(
        "--areas",
        nargs="+",
        choices=clause_registry.AREAS,
        default=list(clause_registry.AREAS),
        metavar="AREA",
        help="the clause areas whose rows to show (default: all): " + ", ".join(clause_registry.AREAS),
    )
    parser.add_argument(
        "--suite",
        default="ckptspec/spec",
        metavar="DIR",
        help="what --run runs (default: ckptspec/spec; ckptspec/spec/protocol for the protocol table)",
    )
    parser.add_argument(
        "--block",
        default="conformance",
        metavar="NAME",
        help="with --update, the block between <!-- NAME:start --> and <!-- NAME:end --> (default: conformance)",
    )
    parser.add_argument(
        "--html",
        type=Path,
        metavar="FILE",
        help="write the filterable results page of every clause area to FILE (--areas and --update do not apply)",
    )
    return parser


def _report(args: argparse.Namespace) -> None:
    runs = []
    for target in args.run:
        json_path = (args.out / f"{target}.json").resolve()
        run_target(target, json_path, args.suite)
        runs.append(json_path)
    paths = [*args.files, *runs]
    if args.html is not None:
        args.html.write_text(results_page.render([load_run(path) for path in paths], clause_verdict))
        return
    block = render([load_run(path) for path in paths], clause_registry.load(tuple(args.areas)))
    write_block(block, args.update, *markers(args.block))


def main(argv: Sequence[str] | None = None) -> int:
    return cli(_parser(), argv, _report)


if __name__ == "__main__":
    sys.exit(main())
