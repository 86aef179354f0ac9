"""The conformance record as types: what `pytest --conformance-json PATH` writes and what every reader reads.

One file is a `RunFile`: the target and its version, the clause registry it was judged against, and one
`PhaseRecord` per phase of a test that the run reported (a test's call, and its setup or teardown where those
failed or skipped). An expected failure's record carries the expectations entry it was judged by (`EntryRecord`:
the clauses it charges, its verdict, whether it is intermittent, its severity for this target); a failure's record
carries how it failed (`FailureRecord`: the exception's type and text, which `record_failures` turns into an entry's
`raises` and `match`).

The writer (ckptspec.spec.harness.plugin) builds these and calls `RunFile.write`; the readers (runs.load_run,
merge_runs, record_failures, ckptspec.faults.matrix) call `RunFile.read`, which validates the file and names the
file and the field on bad input (ReportError). The JSON keys are the field names; a field a file lacks is read as
its default and written back only when set, so that a file read and written again keeps its keys.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["OUTCOMES", "EntryRecord", "FailureRecord", "PhaseRecord", "ReportError", "RunFile", "read_json"]

# Recorded outcomes, best to worst as a test's phases combine (the worst phase is the test's outcome).
OUTCOMES = ("skipped", "passed", "xpass", "xfail", "failed", "error")


class ReportError(Exception):
    """Bad input or a failed run; the message names the file or target."""


def read_json(path: Path | str) -> Any:  # JSON: validated by the callers
    try:
        return json.loads(Path(path).read_text())
    except OSError as exc:
        raise ReportError(f"{path}: cannot read: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: not valid JSON: {exc}") from None


def _check(ok: bool, path: Path, problem: str) -> None:
    if not ok:
        raise ReportError(f"{path}: {problem}")


def _optional_str(value: Any) -> str | None:
    return None if value is None else str(value)


@dataclass(frozen=True)
class EntryRecord:
    """The expectations entry an expected failure (xfail, xpass) was judged by, as the run recorded it."""

    clauses: tuple[str, ...]  # the clauses the entry charges (a subset of those the test cites)
    verdict: str | None = None  # "api-changed", "blocked", "documented-otherwise", "decision", "implied", or None
    intermittent: str | None = None  # "failed k of n runs", for a non-strict entry
    severity: str | None = None  # the entry's severity for this target, where it differs from the clause's

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "clauses": list(self.clauses),
            "verdict": self.verdict,
            "intermittent": self.intermittent,
        }
        return out | ({"severity": self.severity} if self.severity else {})

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> EntryRecord:
        return cls(
            tuple(str(c) for c in data["clauses"]),
            _optional_str(data.get("verdict")),
            _optional_str(data.get("intermittent")),
            _optional_str(data.get("severity")),
        )


@dataclass(frozen=True)
class FailureRecord:
    """How a test failed: the exception's type and the text of its report (cut to 2,000 characters)."""

    type: str
    text: str

    def to_json(self) -> dict[str, Any]:
        return {"type": self.type, "text": self.text}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FailureRecord:
        return cls(str(data.get("type", "")), str(data.get("text", "")))


@dataclass(frozen=True)
class PhaseRecord:
    """One phase of one test as the run reported it."""

    nodeid: str
    outcome: str  # one of OUTCOMES
    when: str = "call"  # "setup", "call" or "teardown"
    clauses: tuple[str, ...] = ()  # the clauses the test cites
    duration: float = 0.0
    message: str = ""  # the skip reason, the xfail reason, or the end of the failure's report
    entry: EntryRecord | None = None  # for xfail and xpass: the expectations entry
    failure: FailureRecord | None = None  # for failed, error and xfail: how it failed

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "nodeid": self.nodeid,
            "outcome": self.outcome,
            "when": self.when,
            "clauses": list(self.clauses),
            "duration": self.duration,
            "message": self.message,
        }
        if self.entry is not None:
            out["entry"] = self.entry.to_json()
        if self.failure is not None:
            out["failure"] = self.failure.to_json()
        return out

    @classmethod
    def from_json(cls, path: Path, index: int, test: Any) -> PhaseRecord:
        """The record `tests[index]` of the file at `path`, validated."""
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
        entry = test.get("entry")
        if entry is not None:
            charged = entry.get("clauses") if isinstance(entry, dict) else None
            if not isinstance(charged, list) or not set(charged) <= set(cited):
                raise ReportError(f"{path}: {where}.entry.clauses must list clauses the test cites")
            entry = EntryRecord.from_json(entry)
        failure = test.get("failure")
        if failure is not None:
            _check(isinstance(failure, dict), path, f"{where}.failure is not an object")
            failure = FailureRecord.from_json(failure)
        return cls(
            test["nodeid"],
            test["outcome"],
            str(test.get("when", "call")),
            tuple(cited),
            float(test.get("duration", 0.0)),
            str(test.get("message", "")),
            entry,
            failure,
        )


@dataclass
class RunFile:
    """One recorded run: a conformance JSON file."""

    target: str
    version: str
    clauses: dict[str, dict[str, Any]]  # the clause registry the run was judged against
    tests: list[PhaseRecord]
    capabilities: list[str] = field(default_factory=list)
    tensor_device: str | None = None  # absent in runs recorded before the device was: read as "cpu"
    format: int | None = None  # provenance.FORMAT, for runs that carry provenance
    provenance: list[dict[str, Any]] | None = None  # one part per run merged into this one (provenance.py)
    merged_from: list[str] | None = None  # the files merge_runs made it from

    @property
    def label(self) -> str:
        """ "target version", the column header of the run."""
        return f"{self.target} {self.version}"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "target": self.target,
            "version": self.version,
            "capabilities": list(self.capabilities),
            "clauses": self.clauses,
            "tests": [test.to_json() for test in self.tests],
        }
        optional = {
            "tensor_device": self.tensor_device,
            "format": self.format,
            "provenance": self.provenance,
            "merged_from": self.merged_from,
        }
        return out | {key: value for key, value in optional.items() if value is not None}

    def write(self, path: Path | str) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")

    @classmethod
    def read(cls, path: Path | str) -> RunFile:
        """Read and validate one conformance JSON file."""
        path = Path(path)
        data = read_json(path)
        _check(isinstance(data, dict), path, "expected a JSON object written by --conformance-json")
        for key, kind in (("target", str), ("version", str), ("clauses", dict), ("tests", list)):
            _check(isinstance(data.get(key), kind), path, f"missing or malformed field {key!r}")
        _check(
            all(isinstance(v, dict) for v in data["clauses"].values()),
            path,
            "field 'clauses' must map clause ids to objects",
        )
        tests = [PhaseRecord.from_json(path, index, test) for index, test in enumerate(data["tests"])]
        parts = data.get("provenance")
        _check(
            parts is None or (isinstance(parts, list) and all(isinstance(p, dict) for p in parts)),
            path,
            "field 'provenance' is not a list",
        )
        merged_from = data.get("merged_from")
        return cls(
            data["target"],
            data["version"],
            data["clauses"],
            tests,
            [str(c) for c in data.get("capabilities", [])],
            _optional_str(data.get("tensor_device")),
            data.get("format"),
            parts,
            None if merged_from is None else [str(p) for p in merged_from],
        )
