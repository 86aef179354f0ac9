"""A target's expectations file: its known failures, each applied as an xfail with the clause and the reason.

The file (named by the adapter's EXPECTATIONS) is TOML:

    [[xfail]]
    test = "spec_tests/<file>.py::<test name>"   the exact node id, or the name of a parametrized family
    clause = "AQ-1"                              one of the clauses the test cites
    reason = "why it fails"

- `load` reads and checks the file (ExpectationsError names the file and the entry).
- `apply` marks the matching tests xfail. Strict (a fixed bug shows up as XPASS, a failure) unless the test
  draws examples with hypothesis and the profile is randomized (`dev`, `nightly`): such a run may miss the
  failing example and pass, so it gets a non-strict xfail (array-api-tests' README warns of exactly this).
  Under the derandomized profile (`ci`) every listed test is strict.
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

__all__ = ["Entry", "ExpectationsError", "apply", "is_hypothesis_test", "load", "unmatched"]

# Functions that run a hypothesis state machine: a test calling one draws examples too.
_MACHINE_RUNNERS = frozenset({"run_machine", "run_state_machine_as_test"})


class ExpectationsError(ValueError):
    """The expectations file is malformed, or an entry does not fit the test it names."""


@dataclass(frozen=True)
class Entry:
    test: str
    clause: str
    reason: str

    @property
    def file(self) -> str:
        """The test file of the entry, relative to the rootdir."""
        return self.test.split("::", 1)[0]

    def matches(self, nodeid: str) -> bool:
        return nodeid == self.test or nodeid.startswith(self.test + "[")


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
        if not isinstance(entry, dict) or set(entry) != fields or not all(isinstance(entry[f], str) for f in fields):
            raise ExpectationsError(f"expectations file {path}: xfail entry {index + 1} needs exactly the string "
                                    f"fields test, clause, reason (has {sorted(entry) if isinstance(entry, dict) else entry})")
        entries.append(Entry(entry["test"], entry["clause"], entry["reason"]))
    return tuple(entries)


def is_hypothesis_test(item: pytest.Item) -> bool:
    """Whether the test draws examples with hypothesis: @given, or it runs a state machine."""
    function = getattr(item, "obj", None)
    if getattr(function, "is_hypothesis_test", False) or item.get_closest_marker("hypothesis"):
        return True
    code = getattr(inspect.unwrap(function), "__code__", None) if callable(function) else None
    return code is not None and not _MACHINE_RUNNERS.isdisjoint(code.co_names)


def apply(path: str, entries: Iterable[Entry], items: Sequence[pytest.Item], cited, randomized_profile: str | None
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
            strict = randomized_profile is None or not is_hypothesis_test(item)
            if not strict:
                reason += f" (not strict: hypothesis under the randomized profile {randomized_profile!r})"
            item.add_marker(pytest.mark.xfail(strict=strict, reason=reason))
    return problems


def unmatched(entries: Iterable[Entry], items: Sequence[pytest.Item], rootdir: Path,
              narrowed: Iterable[Path]) -> list[Entry]:
    """The entries that match no item, among those whose file has items and was not narrowed to node ids.

    `narrowed`: the files the command line named with `::` (only some of their tests were asked for).
    """
    collected = {Path(str(item.path)).resolve() for item in items}
    skipped = {Path(p).resolve() for p in narrowed}
    nodeids = [item.nodeid for item in items]
    return [entry for entry in entries
            if (rootdir / entry.file).resolve() in collected - skipped
            and not any(entry.matches(nodeid) for nodeid in nodeids)]
