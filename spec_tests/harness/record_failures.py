"""Record how each expected failure fails: `raises` and `match` for expectations entries, from a recorded run.

    python -m spec_tests.harness.record_failures RUN.json EXPECTATIONS.toml           what it would record
    python -m spec_tests.harness.record_failures RUN.json EXPECTATIONS.toml --write   record it in the file

RUN.json is a run of the target's release with `--conformance-json` (its expected failures carry "failure": the
exception's type and text, spec_tests.harness.plugin). For each entry of the file that applies to the run's release,
and whose tests failed as expected in the run, without `raises` or `match` yet: `raises` is the exception class the
target raised (a rank's, read from its traceback line, before the harness's own RankFailures / BoundExceeded /
AssertionError), `match` the longest run of whole words of that exception's message free of digits, paths and
quotes (which change from run to run). A proposal is kept only if every recorded failure of the entry fits it
(expectations.failure_problem); an entry whose failures disagree is listed, not recorded. --write adds the two lines
after the entry's `reason` line, leaving the rest of the file as it is.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from spec_tests.harness import expectations

__all__ = ["main", "propose"]

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


def _proposal(failure: dict[str, Any]) -> dict[str, str]:
    found = _exceptions(failure.get("text", ""))
    target = [(name, msg) for name, msg in found if name not in _HARNESS]
    ours = [(name, msg) for name, msg in found if name != "RankFailures"]
    name, message = (target or ours or found or [(failure.get("type", ""), "")])[-1 if target else 0]
    proposal = {"raises": name} if name.isidentifier() else {}
    words = _stable_words(message)
    if words:
        proposal["match"] = re.escape(words)
    return proposal


def propose(
    run: dict[str, Any], entries: Sequence[expectations.Entry]
) -> tuple[dict[expectations.Entry, dict[str, str]], list[str]]:
    """{entry: {"raises", "match"}} for the unchecked entries whose failures the run recorded; and the problems."""
    failures: dict[expectations.Entry, list[dict[str, Any]]] = {}
    for record in run["tests"]:
        if record.get("outcome") != "xfail" or "failure" not in record:
            continue
        for entry in entries:
            if entry.matches(record["nodeid"]) and list(entry.clauses) == record.get("entry", {}).get("clauses"):
                failures.setdefault(entry, []).append(record["failure"])
    proposals, problems = {}, []
    for entry, seen in failures.items():
        if entry.checked:
            continue
        fields = _proposal(seen[0])
        candidate = expectations.Entry(entry.test, entry.clauses, entry.reason, **fields)
        if any(expectations.failure_problem(candidate, [f.get("type", "")], f.get("text", "")) for f in seen):
            fields.pop("match", None)
            candidate = expectations.Entry(entry.test, entry.clauses, entry.reason, **fields)
        if fields and not any(expectations.failure_problem(candidate, [f["type"]], f["text"]) for f in seen):
            proposals[entry] = fields
        else:
            problems.append(f"{entry.test} [{entry.label}]: its {len(seen)} failures share no exception class")
    return proposals, problems


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
        prog="python -m spec_tests.harness.record_failures", description=__doc__.splitlines()[0]
    )
    parser.add_argument("run", type=Path, help="a --conformance-json run of the target's release")
    parser.add_argument("expectations", type=Path, help="the target's expectations file")
    parser.add_argument("--write", action="store_true", help="record the proposals in the file")
    args = parser.parse_args(argv)
    run = json.loads(args.run.read_text())
    entries = expectations.for_version(
        expectations.load(str(args.expectations)), run["version"], run.get("tensor_device", "cpu")
    )
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
