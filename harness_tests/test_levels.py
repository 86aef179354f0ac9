"""Conformance levels (issue 17): a clause's weak level in the registry, the report and the expectations file."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ckptspec.report import clauses
from ckptspec.spec.harness import expectations


def test_weak_levels_of_the_registry_name_strict_clauses():
    registry = clauses.load()
    levels = clauses.weak_levels(registry)
    assert levels["AQ-7"] == "AQ-7w"
    assert levels["AQ-8"] == "AQ-8w"
    assert all(strict in registry and "weakens" not in registry[strict] for strict in levels)


def _load(tmp_path, level: str) -> tuple[expectations.Entry, ...]:
    path = tmp_path / f"{level}.expectations.toml"  # load() caches by path
    path.write_text(
        f'[[xfail]]\ntest = "ckptspec/spec/a.py::test_a"\nclause = "AQ-8"\nreason = "r"\nlevel = "{level}"\n'
    )
    return expectations.load(str(path))


def test_an_entry_names_only_the_strict_level(tmp_path):
    assert _load(tmp_path, "strict")[0].level == "strict"
    with pytest.raises(expectations.ExpectationsError, match="level 'weak'"):
        _load(tmp_path, "weak")


def _item(nodeid: str, cited: str):
    return SimpleNamespace(nodeid=nodeid, cited=[cited])


def _cited(item):
    """The clauses a fake item of _item cites (the plugin reads its marks)."""
    return item.cited


@pytest.mark.parametrize(
    ("clause", "weak_listed", "problem"),
    [
        ("AQ-8", False, None),
        ("AQ-8", True, "every test of its weak level AQ-8w is listed"),
        ("AQ-1", False, "AQ-1 has no weak level"),
    ],
)
def test_a_strict_level_entry_needs_an_unlisted_weak_test(clause, weak_listed, problem):
    entries = [expectations.Entry("ckptspec/spec/a.py::test_strict", (clause,), "r", None, "strict")]
    if weak_listed:
        entries.append(expectations.Entry("ckptspec/spec/b.py::test_weak", ("AQ-8w",), "r"))
    items = [_item("ckptspec/spec/a.py::test_strict", clause), _item("ckptspec/spec/b.py::test_weak", "AQ-8w")]
    problems = expectations._level_problems("x.toml", entries, items, _cited)
    if problem is None:
        assert problems == []
    else:
        assert len(problems) == 1
        assert problem in problems[0]


def test_a_run_narrowed_to_node_ids_does_not_judge_a_weak_level(tmp_path):
    """Running only a target's listed tests (`pytest file.py::test ...`) leaves its unlisted weak tests out: their
    absence is no problem (issue 30: recording how each entry fails)."""
    weak_file = tmp_path / "b.py"
    entries = [
        expectations.Entry("ckptspec/spec/a.py::test_strict", ("AQ-8",), "r", None, "strict"),
        expectations.Entry("ckptspec/spec/b.py::test_weak_listed", ("AQ-8w",), "r"),
    ]
    items = [_item("ckptspec/spec/a.py::test_strict", "AQ-8"), _item("ckptspec/spec/b.py::test_weak_listed", "AQ-8w")]
    for item in items:
        item.path, item.add_marker, item.stash = weak_file, lambda marker: None, pytest.Stash()
    cited = lambda item: item.cited  # noqa: E731
    assert expectations.apply("x.toml", entries, items, cited, None)  # the whole file: every weak test is listed
    assert expectations.apply("x.toml", entries, items, cited, None, narrowed=[weak_file]) == []


@pytest.mark.parametrize(
    ("registry", "problem"),
    [
        ({"A-1": {"no_weak_level": "why"}, "A-1w": {"weakens": "A-1"}}, "says why it has no weak level"),
        ({"A-1": {}, "A-1w": {"weakens": "A-1", "no_weak_level": "why"}}, "`no_weak_level` is a strict clause's"),
        ({"A-1": {"no_weak_level": "  "}}, "`no_weak_level` is a strict clause's"),
        ({"A-1w": {"weakens": "A-9"}}, "not a strict clause"),
    ],
)
def test_a_clause_has_a_weak_level_or_says_why_none_applies_never_both(registry, problem):
    with pytest.raises(clauses.ClauseError, match=problem):
        clauses.check_levels(registry)
    clauses.check_levels({"A-1": {"no_weak_level": "one observable"}, "B-1": {}, "B-1w": {"weakens": "B-1"}})
