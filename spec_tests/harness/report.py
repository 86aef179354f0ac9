"""Conformance table: which clause of the registry (`spec_tests/clauses/`) each target passes, as Markdown.

Input is the JSON that `pytest spec_tests --impl NAME --conformance-json PATH` writes (see
spec_tests.harness.plugin): {"target", "version", "clauses": {id: {...}}, "tests": [{"nodeid", "outcome",
"clauses", ...}]}. Usage:

    python -m spec_tests.harness.report A.json B.json ...        print the table to stdout
    python -m spec_tests.harness.report A.json --update FILE     replace the block between the lines
                                                         <!-- conformance:start --> and
                                                         <!-- conformance:end --> in FILE
    python -m spec_tests.harness.report A.json --areas async_ckpt storage
                                                         only the rows of those clause areas
                                                         (spec_tests.harness.clauses.AREAS, discovered
                                                         from spec_tests/clauses/; default all)
    python -m spec_tests.harness.report --run impl nvrx mcore [--out DIR] [--update FILE]
        first run the suite once per target (`python -m pytest spec_tests -n auto -q -p no:randomly
        --impl T --conformance-json DIR/T.json`, DIR defaulting to conformance/), then report on
        those files. Pytest exit codes 0 and 1 are data; any other code is an error. `run_target` and
        `cli` serve fault_injection.matrix too (its --run runs fault_injection the same way).
    python -m spec_tests.harness.report --run impl nvrx-0.4.1 nvrx-0.7.0 ...
        TARGET-RELEASE runs that release in its nox session (`nox -s "spec(nvrx-0.7.0)"`, noxfile.py).

The README is refreshed with `python -m spec_tests.harness.report --run impl nvrx-0.4.1 nvrx-0.7.0 mcore-0.16.1
mcore-0.19.2 --areas async_ckpt storage local integrity --update README.md` (the FI-* clauses of the faults area have
the fault matrix instead). The protocol table (clause x target of the P-* clauses) is the block `protocol` of the
README: `python -m spec_tests.harness.report --run impl nvrx mcore dcp-thread dcp-process dcp-staged --suite
spec_tests/protocol --areas protocol --block protocol --out conformance/protocol --update README.md`.

Table contract: one row per clause id, registry order first (spec_tests.harness.clauses.load(), so a
clause no test cites is still a row), then ids only the input files know; columns clause,
statement (shortened to about 70 characters), then one column per input file headed
"target version". A test is counted once per nodeid, with its worst recorded phase (a passing call
with a failing teardown is an error). A cell aggregates the tests citing the clause:

    fail   any failed or error (a strict xfail that passed is recorded as failed)
    xfail  else any xfail or xpass (a known failure listed in the target's expectations; xpass: a non-strict
           entry, intermittent or under a randomized profile, that passed this time)
    pass   else any passed
    skip   else any skipped
    not covered  no test cites the clause

followed by "(n)" when all n citing tests have that outcome, else "(k/n)". Below the table: a
legend line and one summary line per target. Bad input (unreadable, not JSON, wrong shape) is an
error naming the file; errors exit with status 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import re
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spec_tests.harness import clauses as clause_registry

__all__ = [
    "END_MARKER",
    "OUTCOMES",
    "START_MARKER",
    "ReportError",
    "Run",
    "cell",
    "cli",
    "level_cell",
    "load_run",
    "main",
    "pytest_command",
    "render",
    "replace_block",
    "run_target",
    "update_file",
    "verdict",
    "write_block",
]

START_MARKER = "<!-- conformance:start -->"
END_MARKER = "<!-- conformance:end -->"
REPO_ROOT = Path(__file__).resolve().parents[2]
STATEMENT_WIDTH = 70

# Recorded outcome -> verdict; verdicts in precedence order (the first present wins).
_VERDICT_OF = {
    "failed": "fail",
    "error": "fail",
    "xpass": "xfail",  # only non-strict entries pass as xpass; a strict one that passes is recorded as failed
    "xfail": "xfail",
    "passed": "pass",
    "skipped": "skip",
}
_PRECEDENCE = ("fail", "xfail", "pass", "skip")
OUTCOMES = frozenset(_VERDICT_OF)
NOT_COVERED = "not covered"
LEGEND = (
    "Legend: **fail** = a citing test failed, errored or passed unexpectedly; **xfail** = "
    "a known failure from the target's expectations file (an intermittent one may have passed), none failed; **pass** = none "
    "failed, some passed; **skip** = all skipped; **not covered** = no test cites the "
    "clause; (n) = all n citing tests, (k/n) = k of the n citing tests. A clause with a weak level "
    "(`weakens`) shows the level reached: **strict**, **weak** (strict tests xfail, weak ones pass) or **fails** "
    "(both xfail)."
)


class ReportError(Exception):
    """Bad input or a failed run; the message names the file or target."""


# ---------------------------------------------------------------------------------- aggregation


def verdict(outcomes: Iterable[str]) -> str:
    """The verdict for a clause whose citing tests had these outcomes (see the module docstring)."""
    present = {_VERDICT_OF[o] for o in outcomes}
    return next((v for v in _PRECEDENCE if v in present), NOT_COVERED)


def cell(outcomes: Sequence[str]) -> str:
    """The verdict with its count: "pass (3)" when all 3 passed, "fail (1/4)" when 1 of 4 failed."""
    result = verdict(outcomes)
    if result == NOT_COVERED:
        return result
    k, n = sum(_VERDICT_OF[o] == result for o in outcomes), len(outcomes)
    return f"{result} ({k})" if k == n else f"{result} ({k}/{n})"


def level_cell(strict: Sequence[str], weak: Sequence[str]) -> str:
    """The cell of a clause with a weak level: the level the target reaches, from both levels' outcomes.

    strict: the strict tests pass; weak: they are known failures and the weak tests pass; fails: both are known
    failures. A failure, skip or missing test of the strict level gives the plain cell.
    """
    strict_verdict, weak_verdict = verdict(strict), verdict(weak)
    if strict_verdict == "pass" and weak_verdict in ("pass", "skip", NOT_COVERED):
        return cell(strict).replace("pass", "strict", 1)
    if strict_verdict != "xfail" or weak_verdict not in ("pass", "xfail"):
        return cell(strict)
    k, n = sum(_VERDICT_OF[o] == "xfail" for o in strict), len(strict)
    return f"{'weak' if weak_verdict == 'pass' else 'fails'} (xfail {k}/{n})"


def _worse(a: str, b: str) -> str:
    return min(a, b, key=lambda o: _PRECEDENCE.index(_VERDICT_OF[o]))


# ---------------------------------------------------------------------------------- input


@dataclass(frozen=True)
class Run:
    """One target's recorded run: each test's worst outcome and the clauses it cites."""

    label: str  # "target version", the column header
    clauses: Mapping[str, Mapping[str, str]]  # the registry the run was recorded against
    tests: Mapping[str, tuple[str, frozenset[str]]]  # nodeid -> (outcome, cited clause ids)

    def outcomes(self, clause_id: str) -> list[str]:
        return [outcome for outcome, cited in self.tests.values() if clause_id in cited]


def _check(ok: bool, path: Path, problem: str) -> None:
    if not ok:
        raise ReportError(f"{path}: {problem}")


def _read_json(path: Path) -> Any:  # JSON: validated by the callers
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: not valid JSON: {exc}") from None


def _check_test(path: Path, index: int, test: Any) -> None:
    where = f"tests[{index}]"
    _check(isinstance(test, dict), path, f"{where} is not an object")
    _check(isinstance(test.get("nodeid"), str), path, f"{where}.nodeid is not a string")
    _check(
        test.get("outcome") in OUTCOMES,
        path,
        f"{where}.outcome {test.get('outcome')!r} is not one of {', '.join(sorted(OUTCOMES))}",
    )
    cited = test.get("clauses")
    _check(
        isinstance(cited, list) and all(isinstance(c, str) for c in cited),
        path,
        f"{where}.clauses is not a list of clause ids",
    )


def load_run(path: Path | str) -> Run:
    """Read and validate one conformance JSON file."""
    path = Path(path)
    data = _read_json(path)
    _check(isinstance(data, dict), path, "expected a JSON object written by --conformance-json")
    for key, kind in (("target", str), ("version", str), ("clauses", dict), ("tests", list)):
        _check(isinstance(data.get(key), kind), path, f"missing or malformed field {key!r}")
    _check(
        all(isinstance(v, dict) for v in data["clauses"].values()),
        path,
        "field 'clauses' must map clause ids to objects",
    )
    tests: dict[str, tuple[str, frozenset[str]]] = {}
    for index, test in enumerate(data["tests"]):
        _check_test(path, index, test)
        outcome, cited = test["outcome"], frozenset(test["clauses"])
        if test["nodeid"] in tests:
            previous, previous_cited = tests[test["nodeid"]]
            outcome, cited = _worse(previous, outcome), previous_cited | cited
        tests[test["nodeid"]] = (outcome, cited)
    return Run(f"{data['target']} {data['version']}", data["clauses"], tests)


# ---------------------------------------------------------------------------------- rendering


def _shorten(text: str, width: int = STATEMENT_WIDTH) -> str:
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text[: width - 1].rsplit(" ", 1)[0]
    return cut.rstrip(",;:") + "…"


def _md(text: str) -> str:
    return text.replace("|", "\\|")


def _rows(runs: Sequence[Run], registry: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """Clause id -> statement: the registry's clauses, then those only the runs know.

    Clauses of the project's registry left out of `registry` (areas not asked for) get no row.
    """
    rows = {cid: entry["statement"] for cid, entry in registry.items()}
    left_out = set(clause_registry.load()) - set(registry)
    for run in runs:
        for cid, entry in run.clauses.items():
            if cid not in left_out:
                rows.setdefault(cid, str(entry.get("statement", "")))
        for _, cited in run.tests.values():
            for cid in sorted(set(cited) - left_out):
                rows.setdefault(cid, "")
    return rows


def _summary(run: Run, clause_ids: Iterable[str]) -> str:
    counts = Counter(_VERDICT_OF[outcome] for outcome, _ in run.tests.values())
    uncovered = [cid for cid in clause_ids if not run.outcomes(cid)]
    return (
        f"- **{_md(run.label)}**: {counts['pass']} passed, {counts['fail']} failed, "
        f"{counts['xfail']} xfail, {counts['skip']} skipped; clauses not covered: "
        f"{', '.join(uncovered) or 'none'}"
    )


def render(runs: Sequence[Run], registry: Mapping[str, Mapping[str, str]] | None = None) -> str:
    """The Markdown table, legend and per-target summaries (ends with a newline)."""
    rows = _rows(runs, clause_registry.load() if registry is None else registry)
    header = ["clause", "statement", *(run.label for run in runs)]
    lines = ["| " + " | ".join(_md(h) for h in header) + " |", "| " + " | ".join("---" for _ in header) + " |"]
    weak_of = clause_registry.weak_levels(
        {**clause_registry.load(), **{c: e for r in runs for c, e in r.clauses.items()}}
    )
    for cid, statement in rows.items():
        if cid in weak_of:
            cells = [cid, _shorten(statement), *(level_cell(r.outcomes(cid), r.outcomes(weak_of[cid])) for r in runs)]
        else:
            cells = [cid, _shorten(statement), *(cell(run.outcomes(cid)) for run in runs)]
        lines.append("| " + " | ".join(_md(c) for c in cells) + " |")
    lines += ["", LEGEND, ""]
    lines += [_summary(run, rows) for run in runs]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------- --update


def replace_block(text: str, block: str, name: str = "input", start: str = START_MARKER, end: str = END_MARKER) -> str:
    """`text` with the lines between the `start` and `end` marker lines replaced by `block`."""
    lines = text.splitlines(keepends=True)
    stripped = [line.strip() for line in lines]
    starts = [i for i, s in enumerate(stripped) if s == start]
    ends = [i for i, s in enumerate(stripped) if s == end]
    if len(starts) != 1 or len(ends) != 1 or ends[0] < starts[0]:
        raise ReportError(
            f"{name}: needs exactly one line {start} followed later by one "
            f"line {end} (found {len(starts)} start, {len(ends)} end)"
        )
    if not block.endswith("\n"):
        block += "\n"
    return "".join(lines[: starts[0] + 1]) + block + "".join(lines[ends[0] :])


def update_file(path: Path, block: str, start: str = START_MARKER, end: str = END_MARKER) -> None:
    """Replace the block between the marker lines of the file at `path` (see replace_block)."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    path.write_text(replace_block(text, block, str(path), start, end))


def write_block(block: str, update: Path | None, start: str = START_MARKER, end: str = END_MARKER) -> None:
    """Print `block`, or with `update`, put it between the marker lines of that file (see replace_block)."""
    if update is None:
        sys.stdout.write(block)
    else:
        update_file(update, block, start, end)


# ---------------------------------------------------------------------------------- --run


# `nvrx-0.7.0`: a release of a target, run in its nox session (noxfile.py) instead of in this environment.
RELEASE_LABEL = re.compile(r"^(?P<target>[A-Za-z0-9_]+)-(?P<release>[0-9][A-Za-z0-9.+]*)$")


def pytest_command(target: str, json_path: Path, suite: str = "spec_tests") -> list[str]:
    """The command that runs `suite` (a directory of the repository) against `target`, recording to `json_path`.

    `target` is a target name (run here, on the installed copy) or TARGET-RELEASE (its nox session `spec(...)`,
    which installs exactly that release in a virtual environment of its own).
    """
    if RELEASE_LABEL.match(target):
        # -r: reuse the session's venv (its install steps still run, and the version check refuses a wrong release).
        return [
            sys.executable,
            "-m",
            "nox",
            "-r",
            "-s",
            f"spec({target})",
            "--",
            suite,
            "--conformance-json",
            str(json_path),
        ]
    return [
        sys.executable,
        "-m",
        "pytest",
        suite,
        "-n",
        "auto",
        "-q",
        "-p",
        "no:randomly",
        "--impl",
        target,
        "--conformance-json",
        str(json_path),
    ]


def run_target(target: str, json_path: Path, suite: str = "spec_tests") -> float:
    """Run `suite` against `target` (its output to stderr), recording to `json_path`; return the wall time in s.

    A previous file at `json_path` is removed first: never report on an old run. Pytest exit codes 0 and 1
    are data; any other means the run did not complete (a ReportError naming the target). Used by this
    module's --run (spec_tests) and by fault_injection.matrix --run (fault_injection).
    """
    if RELEASE_LABEL.match(target) and importlib.util.find_spec("nox") is None:
        raise ReportError(f"{target!r} is run in its nox session, and nox is not installed: pip install -e '.[lint]'")
    json_path.unlink(missing_ok=True)
    json_path.parent.mkdir(parents=True, exist_ok=True)
    command = pytest_command(target, json_path, suite)
    print("$ " + " ".join(command), file=sys.stderr, flush=True)
    start = time.monotonic()
    code = subprocess.run(command, cwd=REPO_ROOT, stdout=sys.stderr, check=False).returncode
    wall = time.monotonic() - start
    if code not in (0, 1):
        raise ReportError(
            f"target {target!r}: pytest exited with code {code} "
            "(0 and 1 are expected; anything else means the run did not complete)"
        )
    return wall


def cli(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, action: Callable[[argparse.Namespace], None]
) -> int:
    """Parse `argv` (JSON files and/or --run TARGET ... required), run `action(args)`; the exit status.

    A ReportError is one line `PROG: error: ...` on stderr and status 1 (shared by this module and
    fault_injection.matrix).
    """
    args = parser.parse_args(argv)
    if not args.files and not args.run:
        parser.error("give JSON files, --run TARGET ..., or both")
    try:
        action(args)
    except ReportError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m spec_tests.harness.report",
        description="Render the clause-by-target conformance table from --conformance-json files.",
    )
    parser.add_argument(
        "files", nargs="*", type=Path, metavar="JSON", help="files written by pytest --conformance-json"
    )
    parser.add_argument(
        "--run",
        nargs="+",
        default=[],
        metavar="TARGET",
        help="first run the suite against each TARGET, then report on its JSON",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("conformance"),
        metavar="DIR",
        help="where --run writes TARGET.json (default: conformance/)",
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
        "--update",
        type=Path,
        metavar="FILE",
        help=f"replace the block between {START_MARKER} and {END_MARKER} in FILE instead of printing",
    )
    parser.add_argument(
        "--suite",
        default="spec_tests",
        metavar="DIR",
        help="what --run runs (default: spec_tests; spec_tests/protocol for the protocol table)",
    )
    parser.add_argument(
        "--block",
        default="conformance",
        metavar="NAME",
        help="with --update, the block between <!-- NAME:start --> and <!-- NAME:end --> (default: conformance)",
    )
    return parser


def _report(args: argparse.Namespace) -> None:
    runs = []
    for target in args.run:
        json_path = (args.out / f"{target}.json").resolve()
        run_target(target, json_path, args.suite)
        runs.append(json_path)
    paths = [*args.files, *runs]
    block = render([load_run(path) for path in paths], clause_registry.load(tuple(args.areas)))
    write_block(block, args.update, f"<!-- {args.block}:start -->", f"<!-- {args.block}:end -->")


def main(argv: Sequence[str] | None = None) -> int:
    return cli(_parser(), argv, _report)


if __name__ == "__main__":
    sys.exit(main())
