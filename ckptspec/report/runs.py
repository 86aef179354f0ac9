"""Recorded runs: the conformance JSON that `pytest --conformance-json PATH` writes, read back and validated, and
the command that makes one (a target here, or one release of it in its nox session).

A file is a `run_file.RunFile` (written by ckptspec.spec.harness.plugin, read by every reader through
`RunFile.read`); this module reads it as the report does: each test once, by its worst phase.

- `load_run(path)` -> Run: each test once, with its worst recorded phase (a passing call with a failing teardown is
  an error); ReportError names the file and the field on bad input.
- `pytest_command`, `run_target`: run a suite against a target, recording to a path (`--run` of the report and of
  ckptspec.faults.matrix); `run_parser` and `cli`: their shared command line (recorded files and/or `--run
  TARGET ...`, `--out`, `--update`) and its error handling.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from ckptspec.report import installed, releases
from ckptspec.report.run_file import OUTCOMES, PhaseRecord, ReportError, RunFile, read_json

__all__ = [
    "OUTCOMES",
    "RELEASE_LABEL",
    "REPO_ROOT",
    "Record",
    "ReportError",
    "Run",
    "clause_anchor",
    "cli",
    "load_run",
    "page_name",
    "pytest_command",
    "read_json",
    "run_parser",
    "run_target",
    "stored_runs",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
RUN_OPTIONS: list[str] = tomllib.loads(installed.CONFIG.read_text())["tool"]["ckptspec"]["run-options"]
"""The pytest options of a recorded run (pyproject.toml, [tool.ckptspec]; nox's spec sessions read the same; an
installed copy reads its own copy of them, ckptspec/report/installed.py)."""
# `nvrx-0.7.0`: a release of a target, run in its nox session (noxfile.py) instead of in this environment.
RELEASE_LABEL = re.compile(r"^(?P<target>[A-Za-z0-9_-]+?)-(?P<release>[0-9][A-Za-z0-9.+]*)$")


class Record(NamedTuple):
    """One test of a run: its worst outcome, the clauses it cites, and for an expected failure its entry."""

    outcome: str
    cited: frozenset[str]
    charged: frozenset[str] = frozenset()  # the clauses its expectations entry names (xfail / xpass only)
    verdict: str | None = None  # the entry's verdict (expectations.VERDICTS) or None
    intermittent: str | None = None  # the entry's "failed k of n runs", for a non-strict entry
    message: str = ""
    severity: str | None = None  # the entry's severity for this target, where it differs from the clause's
    setup_failure: str = ""  # for failed / error: the import error that kept the test from setting up the target


# A failure that is the environment's or the adapter's, not the library's behaviour: the library (or a module, class
# or function the adapter imports from it) could not be imported, in the test's process or a rank's.
_SETUP_FAILURE = re.compile(r"(?m)^(?:E\s+)?\s*(?P<line>(?:ModuleNotFoundError|ImportError): .*)$")
_SETUP_TYPES = ("ImportError", "ModuleNotFoundError")


def setup_failure(failure_type: str, text: str) -> str:
    """The import error that kept a test from setting up its target (its first line), or ""."""
    found = _SETUP_FAILURE.search(text)
    if failure_type in _SETUP_TYPES or found:
        return found["line"].strip()[:300] if found else failure_type
    return ""


@dataclass(frozen=True)
class Run:
    """One target's recorded run."""

    label: str  # "target version", the column header
    clauses: Mapping[str, Mapping[str, Any]]  # the registry the run was recorded against
    tests: Mapping[str, Record]  # nodeid -> its record
    tensor_device: str = "cpu"  # the device of the tensors the snapshot tests built
    provenance: tuple[Mapping[str, Any], ...] = ()  # where it came from, one part per run merged (provenance.py)

    def citing(self, clause_id: str) -> list[Record]:
        """The records citing `clause_id`, by node id: what is generated from them does not depend on the order
        in which a parallel run finished its tests."""
        return [self.tests[nodeid] for nodeid in sorted(self.tests) if clause_id in self.tests[nodeid].cited]

    def severity(self, clause_id: str, default: Any) -> Any:
        """The clause's severity for this target: what an expected failure's entry says (its `severity`), else
        `default` (the clause's own)."""
        own = [r.severity for r in self.citing(clause_id) if r.severity and clause_id in r.charged]
        return own[0] if own else default


def page_name(run: Run) -> str:
    """The file name stem of a run's pages: `nvrx-0.7.0` for the run labelled "nvrx 0.7.0"."""
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", run.label.replace("(", "").replace(")", "")).strip("-")


def clause_anchor(clause_id: str) -> str:
    """The id of the place a run's findings page lists `clause_id` (at most once per page); the results page's
    cells link to it, in the Markdown page and its HTML copy alike."""
    return f"clause-{clause_id.lower()}"


def _record(test: PhaseRecord) -> Record:
    """A phase's record as the report reads it; an expected failure charges its entry's clauses (every clause it
    cites where the run recorded no entry)."""
    cited = frozenset(test.clauses)
    if test.outcome in ("failed", "error"):
        failure = test.failure
        cause = setup_failure(failure.type, failure.text) if failure else setup_failure("", test.message)
        return Record(test.outcome, cited, message=test.message, setup_failure=cause)
    if test.outcome not in ("xfail", "xpass"):
        return Record(test.outcome, cited, message=test.message)
    entry = test.entry
    if entry is None:
        return Record(test.outcome, cited, cited, message=test.message)
    return Record(
        test.outcome, cited, frozenset(entry.clauses), entry.verdict, entry.intermittent, test.message, entry.severity
    )


def load_run(path: Path | str) -> Run:
    """Read and validate one conformance JSON file: each test once, with its worst phase."""
    data = RunFile.read(path)
    tests: dict[str, Record] = {}
    for test in data.tests:
        record = _record(test)
        previous = tests.get(test.nodeid)
        if previous is not None:
            worse = max(previous, record, key=lambda r: OUTCOMES.index(r.outcome))
            record = worse._replace(cited=previous.cited | record.cited)
        tests[test.nodeid] = record
    provenance = tuple(data.provenance or ())
    return Run(data.label, data.clauses, tests, data.tensor_device or "cpu", provenance)


# ---------------------------------------------------------------------------------- making a run


def stored_runs() -> list[Path]:
    """The stored runs this copy carries (a checkout's conformance/all/, or the installed copy's data), in the
    release list's order (impl, then each release), any other stored run after them by name."""
    directory = installed.data_file("conformance/all")
    found = {path.stem: path for path in sorted(directory.glob("*.json"))}
    if not found:
        raise ReportError(f"no stored runs in {directory}")
    listed = [releases.REFERENCE, *(release.name for release in releases.RELEASES)]
    return [found.pop(name) for name in listed if name in found] + list(found.values())


def pytest_command(target: str, json_path: Path, suite: str = "ckptspec/spec") -> list[str]:
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
    command = [sys.executable, "-m", "pytest", *installed.pytest_options(), suite, *RUN_OPTIONS, "--impl", target]
    return [*command, "--conformance-json", str(json_path)]


def run_target(target: str, json_path: Path, suite: str = "ckptspec/spec") -> float:
    """Run `suite` against `target` (its output to stderr), recording to `json_path`; return the wall time in s.

    A previous file at `json_path` is removed first: never report on an old run. Pytest exit codes 0 and 1
    are data; any other means the run did not complete (a ReportError naming the target).
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


def run_parser(prog: str, description: str, *, what: str, written: str, update_help: str) -> argparse.ArgumentParser:
    """The command line every report over recorded runs shares: JSON files and/or `--run TARGET ...` (run `what`
    against each TARGET first), `--out DIR` (where --run writes `written`, TARGET in its name), `--update FILE`."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "files",
        nargs="*",
        type=Path,
        metavar="JSON",
        help="files written by pytest --conformance-json (default, without --run: the stored runs this copy carries)",
    )
    parser.add_argument(
        "--run",
        nargs="+",
        default=[],
        metavar="TARGET",
        help=f"first run {what} against each TARGET, then report on its JSON",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=Path("conformance"),
        metavar="DIR",
        help=f"where --run writes {written} (default: conformance/)",
    )
    parser.add_argument("--update", type=Path, metavar="FILE", help=update_help)
    return parser


def cli(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None, action: Callable[[argparse.Namespace], None]
) -> int:
    """Parse `argv` (JSON files and/or --run TARGET ... required), run `action(args)`; the exit status.

    A ReportError is one line `PROG: error: ...` on stderr and status 1 (the report's and ckptspec.faults.matrix's).
    """
    args = parser.parse_args(argv)
    try:
        if not args.files and not args.run:
            args.files = stored_runs()
        action(args)
    except ReportError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0
