"""The fault matrix: fault x phase x target, as Markdown, from conformance JSON files of the fault suite.

    python -m ckptspec.faults.matrix A.json B.json ...              print the matrix
    python -m ckptspec.faults.matrix A.json ... --update docs/results.md  replace the block between the lines
                                                                    <!-- faults:start --> and <!-- faults:end -->
    python -m ckptspec.faults.matrix --run impl nvrx mcore [--out DIR] [--update docs/results.md]
        first run `pytest ckptspec/faults -n auto -q -p no:randomly --impl T --conformance-json
        DIR/faults-T.json` per target (DIR defaults to conformance/), timing each run, then report on
        those files, with the wall times. Pytest exit codes 0 and 1 are data; any other is an error.
        The run and the command line's error handling are ckptspec.report.runs' (`run_target`, `cli`),
        shared with the conformance table.

Input is what `--conformance-json` writes (see ckptspec.spec.harness.plugin and ckptspec.report.runs). A test's fault
is the family of the FI-* clauses it cites (FI-RANK-1 -> FI-RANK; FI-ORPHAN-1, cited by every fault
test, does not count); its phase is the first `-`-separated word of its parameter id that names a
phase (`test_killed_worker[write-child]` -> write). A cell aggregates the outcomes of the tests of
that fault, phase and target in verdict words (ckptspec.report.verdicts.judge_tests: a known failure is worded by
the basis of the clause its expectations entry names), or says "n/a" where no test exists: the fault cannot happen
in that phase. The row "leftovers (audit)" says whether the orphan audit (FI-ORPHAN-1) failed a test of that phase:
"leaves processes" if it did, "passes" if tests of the phase ran without such a failure.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from ckptspec.report import clauses as clause_registry
from ckptspec.report.blocks import write_block
from ckptspec.report.report import clause_verdict
from ckptspec.report.run_file import PhaseRecord, RunFile
from ckptspec.report.runs import Record, Run, cli, load_run, run_parser, run_target
from ckptspec.report.verdicts import judge_tests

__all__ = ["FAULTS", "PHASES", "TargetRun", "main", "render"]

START_MARKER = "<!-- faults:start -->"
END_MARKER = "<!-- faults:end -->"
from ckptspec.spec.drivers.faults.phases import PHASES  # noqa: E402  (one list of phases, the fault machinery's)

FAULTS = (
    ("FI-RANK", "killed rank"),
    ("FI-WORKER", "killed worker or writer process"),
    ("FI-TRAINER", "trainer killed under its worker"),
    ("FI-HANG", "hung write"),
    ("FI-STORAGE", "ENOSPC / EACCES / EIO"),
    ("FI-CRASH", "crash after any persistence point"),
    ("FI-NODE", "lost node, rank lost in the exchange"),
    ("FI-S3", "S3 endpoint 5xx or gone"),
    ("FI-GPU", "GPU: CUDA IPC, NCCL"),
    ("FI-TRUNCATE", "file truncated after commit"),
    ("FI-BITFLIP", "bit flipped after commit"),
    ("FI-SWAP", "file swapped after commit"),
    ("FI-DELETE", "file deleted after commit"),
    ("FI-PICKLE", "planted pickle in local storage"),
)
AUDIT = "FI-ORPHAN"
NOT_APPLICABLE = "n/a"
LEGEND = (
    "Cells judge the fault tests of that fault, phase and target, in the conformance table's words (a known "
    "failure by the basis of the clause its expectations entry names: **breaks its documentation**, **misses an "
    "implied rule**, **stricter than documented**); **n/a**: the fault cannot happen in that phase; (k of n "
    "tests): only k of the n tests say so. The last row is the orphan audit run around every test. Measured on "
    "CPU (gloo, CPU tensors). A known failure reads as its clause reads in the conformance table and on the "
    "findings page: **weak level only** where the release keeps the clause's weak level."
)


@dataclass(frozen=True)
class TargetRun:
    """One target's recorded fault-suite run: its label, its records, and the wall time if measured."""

    label: str
    records: tuple[PhaseRecord, ...]  # every recorded phase of every test
    tests: dict[str, Record]  # nodeid -> its record, worst phase (ckptspec.report.runs.load_run)
    registry: dict  # the clauses: the run's, then the project's
    wall_s: float | None = None
    run: Run | None = None  # the run as the conformance table reads it (its clause verdicts, weak levels counted)


def load(path: Path | str, wall_s: float | None = None) -> TargetRun:
    """Read one conformance JSON file (validated by ckptspec.report.runs.load_run)."""
    run = load_run(path)
    records = tuple(RunFile.read(path).tests)
    return TargetRun(run.label, records, dict(run.tests), {**run.clauses, **clause_registry.load()}, wall_s, run)


def phase_of(nodeid: str) -> str | None:
    """The phase named by the test's parameter id, or None."""
    match = re.search(r"\[(.*)\]$", nodeid)
    if not match:
        return None
    return next((word for word in match.group(1).split("-") if word in PHASES), None)


def families(clauses) -> set[str]:
    """FI clause families cited (FI-RANK-1 -> FI-RANK), without the audit's."""
    found = set()
    for cid in clauses:
        parts = cid.split("-")
        if len(parts) >= 3 and parts[0] == "FI" and f"FI-{parts[1]}" != AUDIT:
            found.add(f"FI-{parts[1]}")
    return found


def _fault_cell(run: TargetRun, family: str, phase: str) -> str:
    records = [r for n, r in run.tests.items() if phase_of(n) == phase and family in families(r.cited)]
    if not records:
        return NOT_APPLICABLE
    stored = run.run
    if stored is None:
        return str(judge_tests(records, run.registry))
    # A known failure reads as its clause's verdict in the run: the word of the clause's row and findings page.
    return str(judge_tests(records, run.registry, lambda cid: clause_verdict(stored, cid, run.registry).word))


def _audit_cell(run: TargetRun, phase: str) -> str:
    in_phase = {n for n, r in run.tests.items() if phase_of(n) == phase and families(r.cited)}
    if not in_phase:
        return NOT_APPLICABLE
    flagged = {
        r.nodeid
        for r in run.records
        if r.nodeid in in_phase and r.when == "teardown" and r.outcome == "error" and "FI-ORPHAN-1" in r.message
    }
    if flagged:
        return f"leaves processes ({len(flagged)} of {len(in_phase)} tests)"
    ran = [n for n in in_phase if run.tests[n].outcome != "skipped"]
    return "passes" if ran else "skipped"


def render(runs: Sequence[TargetRun], cores: int | None = None) -> str:
    """The matrix, its legend, and the wall times of the runs that were timed (ends with a newline)."""
    header = ["fault", "target", *PHASES]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for family, name in FAULTS:
        for i, run in enumerate(runs):
            first = f"{name} ({family}-*)" if i == 0 else ""
            lines.append("| " + " | ".join([first, run.label, *(_fault_cell(run, family, p) for p in PHASES)]) + " |")
    for i, run in enumerate(runs):
        first = f"leftovers: orphan audit ({AUDIT}-1)" if i == 0 else ""
        lines.append("| " + " | ".join([first, run.label, *(_audit_cell(run, p) for p in PHASES)]) + " |")
    lines += ["", LEGEND]
    timed = [run for run in runs if run.wall_s is not None]
    if timed:
        where = f" on {cores} cores" if cores else ""
        times = ", ".join(f"{run.label} {run.wall_s:.0f} s" for run in timed)
        lines += ["", f"Wall time of `pytest ckptspec/faults -n auto`{where}: {times}."]
    return "\n".join(lines) + "\n"


def _matrix(args: argparse.Namespace) -> None:
    runs = [load(path) for path in args.files]
    for target in args.run:
        json_path = (args.out / f"faults-{target}.json").resolve()
        runs.append(load(json_path, run_target(target, json_path, suite="ckptspec/faults")))
    write_block(render(runs, os.cpu_count() if args.run else None), args.update, START_MARKER, END_MARKER)


def main(argv: Sequence[str] | None = None) -> int:
    parser = run_parser(
        "python -m ckptspec.faults.matrix",
        "Render the fault x phase x target matrix of the fault suite.",
        what="the fault suite (timed)",
        written="faults-TARGET.json",
        update_help=f"replace the block between {START_MARKER} and {END_MARKER} in FILE",
    )
    return cli(parser, argv, _matrix)


if __name__ == "__main__":
    sys.exit(main())
