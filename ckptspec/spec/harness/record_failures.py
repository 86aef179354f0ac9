"""Record how each expected failure fails: `raises` and `match` for expectations entries, from a recorded run.

    python -m ckptspec.spec.harness.record_failures RUN.json EXPECTATIONS.toml           what it would record
    python -m ckptspec.spec.harness.record_failures RUN.json EXPECTATIONS.toml --write   record it in the file

RUN.json is a run of the target's release with `--conformance-json` (its expected failures carry "failure": the
exception's type and text, ckptspec.spec.harness.plugin). For each entry of the file that applies to the run's release,
and whose tests failed as expected in the run, without `raises` or `match` yet: `raises` is the exception class the
target raised (a rank's, read from its traceback line, before the harness's own RankFailures / BoundExceeded /
AssertionError), `match` the longest run of whole words of that exception's message free of digits, paths and
quotes (which change from run to run). A proposal is kept only if every recorded failure of the entry fits it
(expectations.failure_problem); an entry whose failures disagree is listed, not recorded. --write adds the two lines
after the entry's `reason` line, leaving the rest of the file as it is.

    python -m ckptspec.spec.harness.record_failures RUN.json EXPECTATIONS.toml --new [--write]

starts a new target's file from its real failures: for every test of the run that failed with no entry (outcome
failed or error), a stub entry with the test's node id, the clauses it cites (keep those that broke), the `raises`
and `match` proposed as above, and a reason marked FILL IN, for you to replace with the mechanism read in the
library's code. --write appends the stubs to the file (made if missing).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path

from ckptspec.report.run_file import FailureRecord, ReportError, RunFile
from ckptspec.spec.harness import expectations

__all__ = ["FILL_IN", "main", "propose", "stubs"]

FILL_IN = "FILL IN: what in the library makes this test fail (its code or documents, quoted)"

_HARNESS = {"RankFailures", "BoundExceeded", "AssertionError", "Failed", "ExceptionGroup", "BaseExceptionGroup"}
_LINE = re.compile(
    r"^\s*(?:[\w.]+\.)?(?P<name>[A-Z]\w*(?:Error|Exception|Exceeded|Failures|Interrupt))(?::\s*(?P<msg>.*))?$"
)
_STABLE = re.compile(r"[A-Za-z_ ,;:()=<>.-]+")


def _exceptions(text: str) -> list[tuple[str, str]]:
    """(class name, message) of each exception line of `text`, in order."""
    return [(m["name"], m["msg"] or "") for m in map(_LINE.match, text.splitlines()) if m]


def _stable_words(message: str) -> str:
    """The longest run of the message's first line free of digits, paths and quotes (which change from run to run),
    cut to whole words: empty when shorter than 12 characters."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    best = ""
    for run in _STABLE.finditer(line):
        words = run.group(0)
        if run.start() > 0 and not line[run.start() - 1].isspace():
            words = words.split(" ", 1)[1] if " " in words else ""  # a word cut at its start
        if run.end() < len(line) and not words.endswith(" "):
            words = words.rsplit(" ", 1)[0] if " " in words else ""  # a word cut at its end
        words = words.strip(" ,;:(=<>.-")[:80].rsplit(" ", 1)[0] if len(words) > 80 else words.strip(" ,;:(=<>.-")
        best = max(best, words, key=len)
    return best if len(best) >= 12 else ""


def _proposal(failure: FailureRecord) -> dict[str, str]:
    found = _exceptions(failure.text)
    target = [(name, msg) for name, msg in found if name not in _HARNESS]
    ours = [(name, msg) for name, msg in found if name != "RankFailures"]
    name, message = (target or ours or found or [(failure.type, "")])[-1 if target else 0]
    proposal = {"raises": name} if name.isidentifier() else {}
    words = _stable_words(message)
    if words:
        proposal["match"] = re.escape(words)
    return proposal


def propose(
    run: RunFile, entries: Sequence[expectations.Entry]
) -> tuple[dict[expectations.Entry, dict[str, str]], list[str]]:
    """{entry: {"raises", "match"}} for the unchecked entries whose failures the run recorded; and the problems."""
    failures: dict[expectations.Entry, list[FailureRecord]] = {}
    for record in run.tests:
        if record.outcome != "xfail" or record.failure is None:
            continue
        charged = record.entry.clauses if record.entry is not None else None
        for entry in entries:
            if entry.matches(record.nodeid) and tuple(entry.clauses) == charged:
                failures.setdefault(entry, []).append(record.failure)
    proposals, problems = {}, []
    for entry, seen in failures.items():
        if entry.checked:
            continue
        fields = _proposal(seen[0])
        candidate = expectations.Entry(entry.test, entry.clauses, entry.reason, **fields)
        if any(expectations.failure_problem(candidate, [f.type], f.text) for f in seen):
            fields.pop("match", None)
            candidate = expectations.Entry(entry.test, entry.clauses, entry.reason, **fields)
        if fields and not any(expectations.failure_problem(candidate, [f.type], f.text) for f in seen):
            proposals[entry] = fields
        else:
            problems.append(f"{entry.test} [{entry.label}]: its {len(seen)} failures share no exception class")
    return proposals, problems


def stubs(run: RunFile, entries: Sequence[expectations.Entry]) -> tuple[list[str], list[str]]:
    """The `[[xfail]]` stubs of the run's failures that no entry covers, and the failures left out (a test an
    entry names that failed otherwise: its entry is stale, fix it by hand)."""
    blocks, left = [], []
    for record in run.tests:
        if record.outcome not in ("failed", "error"):
            continue
        nodeid = record.nodeid
        if any(entry.matches(nodeid) for entry in entries):
            left.append(f"{nodeid}: an entry names it, yet it failed otherwise than the entry says")
            continue
        cited = list(dict.fromkeys(record.clauses))
        clause = _toml(cited[0]) if len(cited) == 1 else "[" + ", ".join(map(_toml, cited)) + "]"
        lines = ["[[xfail]]", f"test = {_toml(nodeid)}"]
        if len(cited) > 1:
            lines.append("# the test cites several clauses: keep only those its failure breaks")
        lines += [f"clause = {clause}", f"reason = {_toml(FILL_IN)}"]
        fields = _proposal(record.failure) if record.failure is not None else {}
        lines += [f"{key} = {_toml(value)}" for key, value in fields.items()]
        if "match" not in fields:
            lines.append("# no stable words in the message: add a `match` that tells this failure from another")
        blocks.append("\n".join(lines) + "\n")
    return blocks, left


def append(path: Path, blocks: Sequence[str]) -> None:
    """Add the stubs at the end of the expectations file (made if missing; an empty `xfail = []` gives way)."""
    text = path.read_text() if path.exists() else ""
    text = re.sub(r"(?m)^xfail\s*=\s*\[\]\s*$\n?", "", text)
    path.write_text(text + ("\n" if text and not text.endswith("\n\n") else "") + "\n".join(blocks))


def _toml(value: str) -> str:
    return json.dumps(value)  # a JSON string is a TOML basic string


def write(path: Path, proposals: dict[expectations.Entry, dict[str, str]]) -> int:
    """Add each proposal after its entry's reason line; the number of entries changed."""
    blocks = path.read_text().split("[[xfail]]")
    changed = 0
    for entry, fields in proposals.items():
        for i, block in enumerate(blocks):
            if f"test = {_toml(entry.test)}" not in block or f"reason = {_toml(entry.reason)}" not in block:
                continue
            reason = f"reason = {_toml(entry.reason)}\n"
            added = "".join(f"{key} = {_toml(value)}\n" for key, value in fields.items())
            blocks[i] = block.replace(reason, reason + added, 1)
            changed += 1
            break
    path.write_text("[[xfail]]".join(blocks))
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ckptspec.spec.harness.record_failures", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run", type=Path, help="a --conformance-json run of the target's release")
    parser.add_argument("expectations", type=Path, help="the target's expectations file")
    parser.add_argument("--write", action="store_true", help="record the proposals in the file")
    parser.add_argument("--new", action="store_true", help="stub entries for the failures no entry covers")
    args = parser.parse_args(argv)
    try:
        run = RunFile.read(args.run)
    except ReportError as exc:
        parser.error(str(exc))
    loaded = expectations.load(str(args.expectations)) if args.expectations.exists() else ()
    entries = expectations.for_version(loaded, run.version, run.tensor_device or "cpu")
    if args.new:
        blocks, left = stubs(run, entries)
        print("\n".join(blocks), end="")
        for problem in left:
            print(f"not stubbed: {problem}", file=sys.stderr)
        if args.write and blocks:
            append(args.expectations, blocks)
            print(f"{len(blocks)} stub entries added to {args.expectations}: replace each FILL IN reason")
        return 0
    proposals, problems = propose(run, entries)
    for entry, fields in proposals.items():
        print(f"{entry.test} [{entry.label}]: {fields}")
    for problem in problems:
        print(f"not recorded: {problem}", file=sys.stderr)
    if args.write:
        print(f"{write(args.expectations, proposals)} entries recorded in {args.expectations}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
