"""Expectation entries with `versions` (issue 13): one expectations file per target, entries per release.

An entry applies to the releases its `packaging` specifier set contains, matched against the version the run
imported; an entry without `versions` applies to every release; a malformed specifier is one clear error.
"""

from __future__ import annotations

from typing import Any

import pytest

from spec_tests.harness import expectations
from spec_tests.harness.targets import load_target

_FILE = """\
[[xfail]]
test = "spec_tests/a.py::test_every_release"
clause = "AQ-1"
reason = "fails everywhere"

[[xfail]]
test = "spec_tests/a.py::test_old_only"
clause = "AQ-2"
reason = "fixed in 0.5"
versions = "<0.5"

[[xfail]]
test = "spec_tests/a.py::test_new_only"
clause = "AQ-3"
reason = "new in 0.7"
versions = ">=0.7,<0.8"
"""


def _load(tmp_path, text: str) -> tuple[expectations.Entry, ...]:
    path = tmp_path / "x.expectations.toml"
    path.write_text(text)
    return expectations.load(str(path))


@pytest.mark.parametrize(
    ("version", "applying"),
    [
        ("0.4.1", ["test_every_release", "test_old_only"]),
        ("0.7.0", ["test_every_release", "test_new_only"]),
        ("0.7.1rc1", ["test_every_release", "test_new_only"]),
        ("0.6.0", ["test_every_release"]),
        ("(source tree)", ["test_every_release"]),
    ],
)
def test_entries_apply_to_the_releases_they_name(tmp_path, version, applying):
    entries = expectations.for_version(_load(tmp_path, _FILE), version)
    assert [e.test.split("::")[1] for e in entries] == applying


def test_an_entry_keeps_its_specifier(tmp_path):
    old = _load(tmp_path, _FILE)[1]
    assert (old.versions, old.applies_to("0.4.1"), old.applies_to("0.5")) == ("<0.5", True, False)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('versions = "about 0.4"', "versions 'about 0.4' is not a version specifier"),
        ("versions = 4", "needs exactly the string fields test, clause, reason and optionally versions"),
        ('since = "0.4"', "needs exactly the string fields test, clause, reason and optionally versions"),
    ],
)
def test_a_bad_versions_field_is_one_clear_error(tmp_path, extra, message):
    text = f'[[xfail]]\ntest = "spec_tests/a.py::t"\nclause = "AQ-1"\nreason = "r"\n{extra}\n'
    with pytest.raises(expectations.ExpectationsError, match="xfail entry 1") as raised:
        _load(tmp_path, text)
    assert message in str(raised.value)


def test_the_version_is_the_one_imported():
    """A target's version comes from the installed copy its modules are imported from; impl has none."""
    assert load_target("impl").version == "(source tree)"


class _Item:
    """What `apply` reads of a collected test: its node id, markers, and no hypothesis."""

    def __init__(self, nodeid: str):
        self.nodeid, self.obj = nodeid, None
        self.markers: list = []

    def add_marker(self, marker) -> None:
        self.markers.append(marker)

    def get_closest_marker(self, name):
        return None


@pytest.mark.parametrize(("intermittent", "strict"), [(None, True), ("failed 2 of 3 runs", False)])
def test_only_an_intermittent_entry_is_a_non_strict_xfail(tmp_path, intermittent, strict):
    extra = f'intermittent = "{intermittent}"\n' if intermittent else ""
    entries = _load(tmp_path, f'[[xfail]]\ntest = "spec_tests/a.py::t"\nclause = "AQ-1"\nreason = "r"\n{extra}')
    item: Any = _Item("spec_tests/a.py::t[x]")
    assert expectations.apply("f", entries, [item], lambda i: ["AQ-1"], randomized_profile=None) == []
    (marker,) = item.markers
    assert marker.kwargs["strict"] is strict
    assert ("intermittent" in marker.kwargs["reason"]) is not strict
