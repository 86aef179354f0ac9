"""Expectation entries with `versions` (issue 13): one expectations file per target, entries per release.

An entry applies to the releases its `packaging` specifier set contains, matched against the version the run
imported; an entry without `versions` applies to every release; a malformed specifier is one clear error.
"""

from __future__ import annotations

from typing import Any

import pytest

from ckptspec.spec.harness import expectations
from ckptspec.spec.harness.surface.loading import load_target

_FILE = """\
[[xfail]]
test = "ckptspec/spec/a.py::test_every_release"
clause = "AQ-1"
reason = "fails everywhere"

[[xfail]]
test = "ckptspec/spec/a.py::test_old_only"
clause = "AQ-2"
reason = "fixed in 0.5"
versions = "<0.5"

[[xfail]]
test = "ckptspec/spec/a.py::test_new_only"
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


@pytest.mark.parametrize(
    ("device", "applying"), [("cpu", ["test_anywhere", "test_cpu"]), ("cuda", ["test_anywhere", "test_cuda"])]
)
def test_entries_apply_to_the_tensor_device_they_name(tmp_path, device, applying):
    """An entry with tensor_device applies only to runs whose snapshot family holds its tensors there."""
    text = "".join(
        f'[[xfail]]\ntest = "ckptspec/spec/a.py::{name}"\nclause = "P-SNAP-1"\nreason = "r"\n{extra}\n'
        for name, extra in (
            ("test_anywhere", ""),
            ("test_cpu", 'tensor_device = "cpu"'),
            ("test_cuda", 'tensor_device = "cuda"'),
        )
    )
    entries = expectations.for_version(_load(tmp_path, text), "1.0", device)
    assert [e.test.split("::")[1] for e in entries] == applying


def test_an_entry_keeps_its_specifier(tmp_path):
    old = _load(tmp_path, _FILE)[1]
    assert (old.versions, old.applies_to("0.4.1"), old.applies_to("0.5")) == ("<0.5", True, False)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ('versions = "about 0.4"', "versions 'about 0.4' is not a version specifier"),
        ("versions = 4", "every other field a string"),
        ('since = "0.4"', "needs the fields test, clause, reason and optionally intermittent, level, match"),
        ('raises = "not a name"', "raises 'not a name' is not an exception class name"),
        ('match = "(unclosed"', "match '(unclosed' is not a regular expression"),
        ('verdict = "fine"', "verdict 'fine' is not one of api-changed, blocked, decision, documented-otherwise"),
        ('tensor_device = "gpu"', "tensor_device 'gpu' is not 'cpu' or 'cuda'"),
        ('severity = "bad"', "severity 'bad' is not one of data-loss, hang, leak, wrong-error, cosmetic"),
    ],
)
def test_a_bad_versions_field_is_one_clear_error(tmp_path, extra, message):
    text = f'[[xfail]]\ntest = "ckptspec/spec/a.py::t"\nclause = "AQ-1"\nreason = "r"\n{extra}\n'
    with pytest.raises(expectations.ExpectationsError, match="xfail entry 1") as raised:
        _load(tmp_path, text)
    assert message in str(raised.value)


@pytest.mark.parametrize("verdict", sorted(expectations.VERDICTS))
def test_every_entry_verdict_loads_and_has_a_word(tmp_path, verdict):
    """Each verdict an entry may carry (implied among them) loads, and the report has a word for it."""
    from ckptspec.report import verdicts

    text = f'[[xfail]]\ntest = "ckptspec/spec/a.py::t"\nclause = "AQ-1"\nreason = "r"\nverdict = "{verdict}"\n'
    assert _load(tmp_path, text)[0].verdict == verdict
    assert verdict in verdicts._ENTRY_VERDICTS


def test_the_version_is_the_one_imported():
    """A target's version comes from the installed copy its modules are imported from; impl has none."""
    assert load_target("impl").version == "(source tree)"


class _Item:
    """What `apply` reads of a collected test: its node id, markers, stash, and no hypothesis."""

    def __init__(self, nodeid: str):
        self.nodeid, self.obj = nodeid, None
        self.markers: list = []
        self.stash = pytest.Stash()

    def add_marker(self, marker) -> None:
        self.markers.append(marker)

    def get_closest_marker(self, name):
        return None


@pytest.mark.parametrize(("intermittent", "strict"), [(None, True), ("failed 2 of 3 runs", False)])
def test_only_an_intermittent_entry_is_a_non_strict_xfail(tmp_path, intermittent, strict):
    extra = f'intermittent = "{intermittent}"\n' if intermittent else ""
    entries = _load(tmp_path, f'[[xfail]]\ntest = "ckptspec/spec/a.py::t"\nclause = "AQ-1"\nreason = "r"\n{extra}')
    item: Any = _Item("ckptspec/spec/a.py::t[x]")
    assert expectations.apply("f", entries, [item], lambda i: ["AQ-1"], randomized_profile=None) == []
    (marker,) = item.markers
    assert marker.kwargs["strict"] is strict
    assert ("intermittent" in marker.kwargs["reason"]) is not strict


def test_an_entry_may_charge_several_clauses(tmp_path):
    text = '[[xfail]]\ntest = "ckptspec/spec/a.py::t"\nclause = ["AQ-1", "AQ-2"]\nreason = "r"\n'
    (entry,) = _load(tmp_path, text)
    assert (entry.clauses, entry.label, entry.checked) == (("AQ-1", "AQ-2"), "AQ-1, AQ-2", False)
    (tmp_path / "empty").mkdir()
    with pytest.raises(expectations.ExpectationsError, match="non-empty list of ids"):
        _load(tmp_path / "empty", text.replace('["AQ-1", "AQ-2"]', "[]"))


_RANK_FAILURE = "RankFailures: 1 of 2 ranks failed:\n\nrank 1 raised\n    Traceback (most recent call last):\n" + (
    "      File \"x.py\", line 3, in body\n    TypeError: close() got an unexpected keyword argument 'abort'"
)


@pytest.mark.parametrize(
    ("fields", "fits"),
    [
        ({"raises": "RankFailures"}, True),  # the class raised in the test process
        ({"raises": "AssertionError"}, True),  # one of its bases
        ({"raises": "TypeError"}, True),  # a rank's exception, from its traceback line
        ({"raises": "ValueError"}, False),
        ({"match": "unexpected keyword argument 'abort'"}, True),
        ({"match": "hung|did not finish"}, False),
        ({"raises": "TypeError", "match": "did not finish"}, False),  # both must fit
        ({}, True),  # an unchecked entry judges nothing
    ],
)
def test_a_failure_is_checked_against_its_entry(fields, fits):
    """An entry's raises / match must fit the failure; otherwise the problem names the entry and the failure."""
    entry = expectations.Entry("ckptspec/spec/a.py::t", ("AQ-11",), "r", **fields)
    problem = expectations.failure_problem(entry, ["RankFailures", "AssertionError", "Exception"], _RANK_FAILURE)
    assert (problem is None) == fits
    if not fits:
        assert problem is not None
        assert problem.startswith("stale expectations entry for ckptspec/spec/a.py::t [AQ-11]")
        assert "RankFailures: 1 of 2 ranks failed" in problem
