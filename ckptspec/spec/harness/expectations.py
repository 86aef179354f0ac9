"""A target's expectations file: its known failures, each applied as an xfail with the clause and the reason.

The file (named by the adapter's EXPECTATIONS) is TOML:

    [[xfail]]
    test = "ckptspec/spec/<file>.py::<test name>"   the exact node id, or the name of a parametrized family
    clause = "AQ-1"                              the clause(s) the failure breaks: one id, or a list of ids,
                                                 each cited by the test; the report charges the failure to
                                                 these only, never to the test's other clauses
    reason = "why it fails"                      the mechanism, as read in the target's source
    raises = "TypeError"                         how it fails: the name of the exception class, raised in the
                                                 test process or on a rank (a traceback line of a rank's
                                                 report), and/or
    match = "no abort parameter"                 a regular expression searched in the failure's text (the
                                                 exception's type name, message and notes; a rank failure's
                                                 message holds each rank's traceback). A listed test that
                                                 fails another way is a stale entry: the test is reported
                                                 failed, as an XPASS of a strict entry is
    verdict = "api-changed"                      optional: what the failure means when it is not the target
                                                 breaking the clause: "api-changed" (the release renamed or
                                                 removed the API the test calls) or "documented-otherwise"
                                                 (the release's own documents promise something else; the
                                                 reason quotes them) or "decision" (this target's documents
                                                 do not promise what the clause asks in this run, e.g. a
                                                 snapshot of CPU tensors where staging is promised for GPU
                                                 tensors only: the clause is the spec's decision here) or
                                                 "implied" (this target's documents do not state what the
                                                 clause's documented source promises, and its own code or
                                                 messages imply it: the reason quotes them) or "blocked"
                                                 (every save of this target fails on another clause's
                                                 mechanism before the test reaches its own: the clause is
                                                 not judged; the reason names that clause and its
                                                 mechanism, and `match` its error)
    versions = "<0.5"                            optional: only for these releases of the target (a
                                                 `packaging` specifier set, matched against the version
                                                 actually imported; an entry without it applies to all)
    level = "strict"                             optional: the target misses only the strict level of the
                                                 clause; allowed only when the clause has a weak level
                                                 (`weakens`) whose tests run here unlisted, so must pass
    intermittent = "failed 2 of 3 runs"          optional: the failure does not happen on every run (a race
                                                 in the target); the xfail is then not strict, and the
                                                 value says how often it was seen
    severity = "wrong-error"                     optional: what a user of this target suffers, where it is less
                                                 (or more) than the clause's severity says (e.g. a loud
                                                 assertion where the clause fears silent data loss); the
                                                 reason says why. The findings pages use it for this target
    tensor_device = "cuda"                       optional: only when the snapshot family's tensors live on
                                                 this device (--tensor-device; devices.py); without it the
                                                 entry applies on either

One file per target, its entries for every release (array-api-tests' per-library xfail files, with
versions): `for_version` keeps the entries that apply to the release under test; the others are neither
applied nor reported as stale.

- `load` reads and checks the file (ExpectationsError names the file and the entry).
- `apply` marks the matching tests xfail and stashes each one's entry (ENTRY). Strict (a fixed bug shows up as XPASS, a failure) unless the test
  draws examples with hypothesis and the profile is randomized (`explore`, `nightly`): such a run may miss the
  failing example and pass, so it gets a non-strict xfail (array-api-tests' README warns of exactly this).
  Under the derandomized profile (`ci`) every listed test is strict, except entries marked `intermittent`.
- `failure_problem` says when a failure does not fit its entry's `raises` / `match`; the plugin then reports
  the test failed (a stale entry).
- `unmatched` lists the entries that match no collected test, among the test files this run collected whole:
  a run of one area, one file or one node id (or with -k, which deselects after this check) says nothing
  about entries of files it did not collect whole.
"""

from __future__ import annotations

import functools
import inspect
import re
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ckptspec.report import clauses as clause_registry
from ckptspec.report.clauses import SEVERITIES

__all__ = [
    "VERDICTS",
    "Entry",
    "ExpectationsError",
    "apply",
    "describe_failure",
    "failure_problem",
    "for_version",
    "is_hypothesis_test",
    "load",
    "unmatched",
]

# An entry's `verdict`: what its failure means when it is not the target breaking the clause.
VERDICTS = frozenset({"api-changed", "blocked", "documented-otherwise", "decision", "implied"})
_REQUIRED = {"test", "clause", "reason"}
_OPTIONAL = {"versions", "level", "intermittent", "raises", "match", "verdict", "tensor_device", "severity"}

# Functions that run a hypothesis state machine: a test calling one draws examples too.
_MACHINE_RUNNERS = frozenset({"run_machine", "run_state_machine_as_test"})


class ExpectationsError(ValueError):
    """The expectations file is malformed, or an entry does not fit the test it names."""


@dataclass(frozen=True)
class Entry:
    test: str
    clauses: tuple[str, ...]  # the clauses the failure breaks (each cited by the test)
    reason: str
    versions: str | None = None  # a packaging specifier set, e.g. "<0.5"; None: every release
    level: str | None = None  # "strict": the target still meets the clause's weak level
    intermittent: str | None = None  # how often the failure was seen, when not on every run: a non-strict xfail
    raises: str | None = None  # the exception class name the failure shows
    match: str | None = None  # a regular expression the failure's text contains
    verdict: str | None = None  # one of VERDICTS, or None: the target breaks the clause
    tensor_device: str | None = None  # "cpu" or "cuda": only for runs with the trainer's tensors there
    severity: str | None = None  # this target's severity where it differs from the clause's; None: the clause's

    @property
    def label(self) -> str:
        """The clause ids as the reason's prefix shows them: "AQ-1" or "AQ-1, AQ-2"."""
        return ", ".join(self.clauses)

    @property
    def checked(self) -> bool:
        """Whether the entry says how the test fails (raises or match), so a different failure is caught."""
        return self.raises is not None or self.match is not None

    @property
    def file(self) -> str:
        """The test file of the entry, relative to the rootdir."""
        return self.test.split("::", 1)[0]

    def matches(self, nodeid: str) -> bool:
        return nodeid == self.test or nodeid.startswith(self.test + "[")

    def applies_to(self, version: str) -> bool:
        """Whether the entry is for this release: always without `versions`; never for an unparsable version."""
        if self.versions is None:
            return True
        try:
            return SpecifierSet(self.versions).contains(Version(version), prereleases=True)
        except InvalidVersion:
            return False


# The entry that made an item an expected failure (set by `apply`, read when the item's failure is reported).
ENTRY = pytest.StashKey[Entry]()


@functools.cache
def load(path: str | None) -> tuple[Entry, ...]:
    """The entries of the expectations file at `path` (none for None)."""
    if path is None:
        return ()
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ExpectationsError(f"expectations file {path}: {exc}") from None
    return tuple(_entry(path, index, entry) for index, entry in enumerate(data.get("xfail", [])))


def _entry(path: str, index: int, entry: object) -> Entry:
    """One [[xfail]] table, checked; ExpectationsError names the file, the entry and what is wrong."""
    where = f"expectations file {path}: xfail entry {index + 1}"
    if not isinstance(entry, dict) or not _REQUIRED <= set(entry) <= _REQUIRED | _OPTIONAL:
        raise ExpectationsError(
            f"{where} needs the fields test, clause, reason and optionally {', '.join(sorted(_OPTIONAL))} "
            f"(has {sorted(entry) if isinstance(entry, dict) else entry})"
        )
    clause = entry["clause"]
    clause_ids = (clause,) if isinstance(clause, str) else tuple(clause) if isinstance(clause, list) else ()
    strings = [value for key, value in entry.items() if key != "clause"]
    if (
        not clause_ids
        or not all(isinstance(c, str) for c in clause_ids)
        or not all(isinstance(v, str) for v in strings)
    ):
        raise ExpectationsError(f"{where}: clause must be an id or a non-empty list of ids, every other field a string")
    where += f" ({entry['test']})"
    if "versions" in entry:
        try:
            SpecifierSet(entry["versions"])
        except InvalidSpecifier:
            raise ExpectationsError(
                f'{where}: versions {entry["versions"]!r} is not a version specifier such as "<0.5" or ">=0.5,<0.7"'
            ) from None
    if entry.get("tensor_device", "cpu") not in ("cpu", "cuda"):
        raise ExpectationsError(f"{where}: tensor_device {entry['tensor_device']!r} is not 'cpu' or 'cuda'")
    if entry.get("level", "strict") != "strict":
        raise ExpectationsError(
            f"{where}: level {entry['level']!r} is not 'strict' (a weak-level failure is an entry for the weak clause)"
        )
    if entry.get("verdict", "api-changed") not in VERDICTS:
        raise ExpectationsError(f"{where}: verdict {entry['verdict']!r} is not one of {', '.join(sorted(VERDICTS))}")
    if entry.get("severity", "data-loss") not in SEVERITIES:
        raise ExpectationsError(f"{where}: severity {entry['severity']!r} is not one of {', '.join(SEVERITIES)}")
    if "raises" in entry and not entry["raises"].isidentifier():
        raise ExpectationsError(f"{where}: raises {entry['raises']!r} is not an exception class name")
    if "match" in entry:
        try:
            re.compile(entry["match"])
        except re.error as exc:
            raise ExpectationsError(f"{where}: match {entry['match']!r} is not a regular expression: {exc}") from None
    return Entry(
        entry["test"],
        clause_ids,
        entry["reason"],
        **{key: entry[key] for key in _OPTIONAL if key in entry},
    )


def describe_failure(exc: BaseException) -> tuple[list[str], str]:
    """The class names of `exc`, its bases and (for a group) its members', and its text: type, message, notes (what
    failure_problem judges)."""
    members = list(exc.exceptions) if isinstance(exc, BaseExceptionGroup) else []
    names = [cls.__name__ for e in [exc, *members] for cls in type(e).__mro__]
    text = "\n".join([f"{type(e).__name__}: {e}" for e in [exc, *members]] + list(getattr(exc, "__notes__", [])))
    return names, text


def failure_problem(entry: Entry, type_names: Iterable[str], text: str) -> str | None:
    """Why a failure does not fit the entry that expects it (None when it fits, or the entry says nothing).

    `type_names`: the class names of the failure's exception and its bases (and of the exceptions of a group);
    `text`: its type name, message and notes. `raises` fits a class name of `type_names` or a rank's traceback
    line `Name: ...` in `text`; `match` is searched in `text`.
    """
    wrong = []
    rank_line = rf"(?m)^\s*(?:[\w.]+\.)?{re.escape(entry.raises or '')}(?::|$)"
    if entry.raises is not None and entry.raises not in set(type_names) and not re.search(rank_line, text):
        wrong.append(f"raises {entry.raises}")
    if entry.match is not None and not re.search(entry.match, text):
        wrong.append(f"match {entry.match!r}")
    if not wrong:
        return None
    first = next((line.strip() for line in text.splitlines() if line.strip()), "(no message)")
    return (
        f"stale expectations entry for {entry.test} [{entry.label}]: it expects the failure to show "
        f"{' and '.join(wrong)}, but the test failed otherwise: {first[:300]}"
    )


def for_version(entries: Iterable[Entry], version: str, tensor_device: str = "cpu") -> tuple[Entry, ...]:
    """The entries that apply to release `version` of the target (see Entry.applies_to), in a run whose snapshot
    family holds its tensors on `tensor_device`."""
    return tuple(
        entry for entry in entries if entry.applies_to(version) and entry.tensor_device in (None, tensor_device)
    )


def is_hypothesis_test(item: pytest.Item) -> bool:
    """Whether the test draws examples with hypothesis: @given, or it runs a state machine."""
    function = getattr(item, "obj", None)
    if getattr(function, "is_hypothesis_test", False) or item.get_closest_marker("hypothesis"):
        return True
    code = getattr(inspect.unwrap(function), "__code__", None) if callable(function) else None
    return code is not None and not _MACHINE_RUNNERS.isdisjoint(code.co_names)


def apply(
    path: str,
    entries: Iterable[Entry],
    items: Sequence[pytest.Item],
    cited: Callable[[pytest.Item], list[str]],
    randomized_profile: str | None,
    narrowed: Iterable[Path] = (),
) -> list[str]:
    """Mark the items the entries match; return the problems (an entry whose test does not cite its clause).

    `cited(item)` lists the clause ids an item cites; `randomized_profile` is the name of the hypothesis profile
    when it is not derandomized, else None; `narrowed`: the files the command line named with `::` (their tests
    not asked for are not collected, so they say nothing of a weak level).
    """
    problems = []
    for entry in entries:
        for item in (i for i in items if entry.matches(i.nodeid)):
            uncited = [c for c in entry.clauses if c not in cited(item)]
            if uncited:
                problems.append(f"{path}: {entry.test} does not cite clause {', '.join(uncited)}")
                continue
            item.stash[ENTRY] = entry
            reason = f"[{entry.label}] {entry.reason}"
            strict = entry.intermittent is None and (randomized_profile is None or not is_hypothesis_test(item))
            if entry.intermittent is not None:
                reason += f" (not strict: intermittent, {entry.intermittent})"
            elif not strict:
                reason += f" (not strict: hypothesis under the randomized profile {randomized_profile!r})"
            item.add_marker(pytest.mark.xfail(strict=strict, reason=reason))
    skipped = {Path(p).resolve() for p in narrowed}
    whole = [item for item in items if Path(str(item.path)).resolve() not in skipped] if skipped else items
    return problems + _level_problems(path, list(entries), whole, cited)


def _level_problems(
    path: str, entries: list[Entry], items: Sequence[pytest.Item], cited: Callable[[pytest.Item], list[str]]
) -> list[str]:
    """Entries naming level "strict" whose clause has no weak level, or whose weak tests are all listed too.

    The weak tests that run unlisted must pass, so the run itself checks the level an entry claims. A run that
    collected no test of the weak clause (one file, one node id) cannot judge the entry and says nothing.
    """
    weak_of = clause_registry.weak_levels(clause_registry.load())
    problems = []
    for entry in (e for e in entries if e.level == "strict"):
        strict = [c for c in entry.clauses if c in weak_of]
        if len(strict) != len(entry.clauses):
            problems.append(f"{path}: {entry.test} names level strict, but {entry.label} has no weak level")
            continue
        weak = weak_of[strict[0]]
        weak_items = [i for i in items if weak in cited(i)]
        if weak_items and all(any(e.matches(i.nodeid) for e in entries) for i in weak_items):
            problems.append(
                f"{path}: {entry.test} names level strict of {entry.label}, but every test of its weak level "
                f"{weak} is listed as a known failure too"
            )
    return problems


def unmatched(
    entries: Iterable[Entry], items: Sequence[pytest.Item], rootdir: Path, narrowed: Iterable[Path]
) -> list[Entry]:
    """The entries that match no item, among those whose file has items and was not narrowed to node ids.

    `narrowed`: the files the command line named with `::` (only some of their tests were asked for).
    """
    collected = {Path(str(item.path)).resolve() for item in items}
    skipped = {Path(p).resolve() for p in narrowed}
    nodeids = [item.nodeid for item in items]
    return [
        entry
        for entry in entries
        if (rootdir / entry.file).resolve() in collected - skipped
        and not any(entry.matches(nodeid) for nodeid in nodeids)
    ]
