"""A target's expectations file: its known failures, each applied as an xfail with the clause and the reason.

The file (named by the adapter's EXPECTATIONS) is TOML:

    [[xfail]]
    test = "spec_tests/<file>.py::<test name>"   the exact node id, or the name of a parametrized family
    clause = "AQ-1"                              one of the clauses the test cites
    reason = "why it fails"
    versions = "<0.5"                            optional: only for these releases of the target (a
                                                 `packaging` specifier set, matched against the version
                                                 actually imported; an entry without it applies to all)
    level = "strict"                             optional: the target misses only the strict level of the
                                                 clause; allowed only when the clause has a weak level
                                                 (`weakens`) whose tests run here unlisted, so must pass
    intermittent = "failed 2 of 3 runs"          optional: the failure does not happen on every run (a race
                                                 in the target); the xfail is then not strict, and the
                                                 value says how often it was seen

One file per target, its entries for every release (array-api-tests' per-library xfail files, with
versions): `for_version` keeps the entries that apply to the release under test; the others are neither
applied nor reported as stale.

- `load` reads and checks the file (ExpectationsError names the file and the entry).
- `apply` marks the matching tests xfail. Strict (a fixed bug shows up as XPASS, a failure) unless the test
  draws examples with hypothesis and the profile is randomized (`dev`, `nightly`): such a run may miss the
  failing example and pass, so it gets a non-strict xfail (array-api-tests' README warns of exactly this).
  Under the derandomized profile (`ci`) every listed test is strict, except entries marked `intermittent`.
- `unmatched` lists the entries that match no collected test, among the test files this run collected whole:
  a run of one area, one file or one node id (or with -k, which deselects after this check) says nothing
  about entries of files it did not collect whole.
"""

from __future__ import annotations

import functools
import inspect
import tomllib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from spec_tests.harness import clauses as clause_registry

__all__ = ["Entry", "ExpectationsError", "apply", "for_version", "is_hypothesis_test", "load", "unmatched"]

# Functions that run a hypothesis state machine: a test calling one draws examples too.
_MACHINE_RUNNERS = frozenset({"run_machine", "run_state_machine_as_test"})


class ExpectationsError(ValueError):
    """The expectations file is malformed, or an entry does not fit the test it names."""


@dataclass(frozen=True)
class Entry:
    test: str
    clause: str
    reason: str
    versions: str | None = None  # a packaging specifier set, e.g. "<0.5"; None: every release
    level: str | None = None  # "strict": the target still meets the clause's weak level
    intermittent: str | None = None  # how often the failure was seen, when not on every run: a non-strict xfail

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


@functools.cache
def load(path: str | None) -> tuple[Entry, ...]:
    """The entries of the expectations file at `path` (none for None)."""
    if path is None:
        return ()
    try:
        data = tomllib.loads(Path(path).read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ExpectationsError(f"expectations file {path}: {exc}") from None
    entries = []
    for index, entry in enumerate(data.get("xfail", [])):
        fields = {"test", "clause", "reason"}
        if (
            not isinstance(entry, dict)
            or not fields <= set(entry) <= fields | {"versions", "level", "intermittent"}
            or not all(isinstance(value, str) for value in entry.values())
        ):
            raise ExpectationsError(
                f"expectations file {path}: xfail entry {index + 1} needs exactly the string "
                f"fields test, clause, reason and optionally versions, level, intermittent "
                f"(has {sorted(entry) if isinstance(entry, dict) else entry})"
            )
        if "versions" in entry:
            try:
                SpecifierSet(entry["versions"])
            except InvalidSpecifier:
                raise ExpectationsError(
                    f"expectations file {path}: xfail entry {index + 1} ({entry['test']}): "
                    f"versions {entry['versions']!r} is not a version specifier "
                    'such as "<0.5" or ">=0.5,<0.7"'
                ) from None
        if entry.get("level", "strict") != "strict":
            raise ExpectationsError(
                f"expectations file {path}: xfail entry {index + 1} ({entry['test']}): "
                f"level {entry['level']!r} is not 'strict' (a weak-level failure is an entry for the weak clause)"
            )
        entries.append(
            Entry(
                entry["test"],
                entry["clause"],
                entry["reason"],
                entry.get("versions"),
                entry.get("level"),
                entry.get("intermittent"),
            )
        )
    return tuple(entries)


def for_version(entries: Iterable[Entry], version: str) -> tuple[Entry, ...]:
    """The entries that apply to release `version` of the target (see Entry.applies_to)."""
    return tuple(entry for entry in entries if entry.applies_to(version))


def is_hypothesis_test(item: pytest.Item) -> bool:
    """Whether the test draws examples with hypothesis: @given, or it runs a state machine."""
    function = getattr(item, "obj", None)
    if getattr(function, "is_hypothesis_test", False) or item.get_closest_marker("hypothesis"):
        return True
    code = getattr(inspect.unwrap(function), "__code__", None) if callable(function) else None
    return code is not None and not _MACHINE_RUNNERS.isdisjoint(code.co_names)


def apply(
    path: str, entries: Iterable[Entry], items: Sequence[pytest.Item], cited, randomized_profile: str | None
) -> list[str]:
    """Mark the items the entries match; return the problems (an entry whose test does not cite its clause).

    `cited(item)` lists the clause ids an item cites; `randomized_profile` is the name of the hypothesis profile
    when it is not derandomized, else None.
    """
    problems = []
    for entry in entries:
        for item in (i for i in items if entry.matches(i.nodeid)):
            if entry.clause not in cited(item):
                problems.append(f"{path}: {entry.test} does not cite clause {entry.clause}")
                continue
            reason = f"[{entry.clause}] {entry.reason}"
            strict = entry.intermittent is None and (randomized_profile is None or not is_hypothesis_test(item))
            if entry.intermittent is not None:
                reason += f" (not strict: intermittent, {entry.intermittent})"
            elif not strict:
                reason += f" (not strict: hypothesis under the randomized profile {randomized_profile!r})"
            item.add_marker(pytest.mark.xfail(strict=strict, reason=reason))
    return problems + _level_problems(path, list(entries), items, cited)


def _level_problems(path: str, entries: list[Entry], items: Sequence[pytest.Item], cited) -> list[str]:
    """Entries naming level "strict" whose clause has no weak level, or whose weak tests are all listed too.

    The weak tests that run unlisted must pass, so the run itself checks the level an entry claims. A run that
    collected no test of the weak clause (one file, one node id) cannot judge the entry and says nothing.
    """
    weak_of = clause_registry.weak_levels(clause_registry.load())
    problems = []
    for entry in (e for e in entries if e.level == "strict"):
        weak = weak_of.get(entry.clause)
        if weak is None:
            problems.append(f"{path}: {entry.test} names level strict, but {entry.clause} has no weak level")
            continue
        weak_items = [i for i in items if weak in cited(i)]
        if weak_items and all(any(e.matches(i.nodeid) for e in entries) for i in weak_items):
            problems.append(
                f"{path}: {entry.test} names level strict of {entry.clause}, but every test of its weak level "
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
