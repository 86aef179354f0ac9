"""Expectations entries say how a test fails, and a failure is charged to the clauses its entry names (issue 30).

One pytest run in a subprocess over tiny tests with an adapter whose expectations file checks each failure: a
failure that fits its entry's `raises` / `match` is an xfail, one that fails otherwise is reported failed with a
line naming the stale entry, and the conformance JSON records, per expected failure, the clauses it is charged to
and the failure's type and text.
"""

from __future__ import annotations

import json

from harness_tests.pytest_runs import REPO_ROOT, clean_env, run_pytest

_ADAPTER = """\
from ckptspec.spec.targets.impl import CAPABILITIES, MODULES, checkpoint_manager, protocol_saver  # noqa: F401
from pathlib import Path
NAME = "checked_adapter"
DISTRIBUTION = None
EXPECTATIONS = str(Path(__file__).with_name("checked_adapter.toml"))
"""
_TESTS = """\
import pytest


@pytest.mark.spec("AQ-3", "AQ-4")
def test_fits_its_entry():
    raise TypeError("close() got an unexpected keyword argument 'abort'")


@pytest.mark.spec("AQ-3")
def test_fails_otherwise():
    raise ValueError("a different bug")


@pytest.mark.spec("AQ-5")
def test_fits_by_message():
    assert False, "finalize waited 90 s"
"""
_ENTRIES = """\
[[xfail]]
test = "test_checked.py::test_fits_its_entry"
clause = "AQ-4"
reason = "no abort parameter"
raises = "TypeError"
match = "unexpected keyword argument 'abort'"

[[xfail]]
test = "test_checked.py::test_fails_otherwise"
clause = "AQ-3"
reason = "recorded as a TypeError once"
raises = "TypeError"

[[xfail]]
test = "test_checked.py::test_fits_by_message"
clause = "AQ-5"
reason = "hangs"
match = "waited \\\\d+ s"
verdict = "documented-otherwise"
"""


def test_failures_are_checked_and_charged(tmp_path):
    files = {"checked_adapter.py": _ADAPTER, "checked_adapter.toml": _ENTRIES, "test_checked.py": _TESTS}
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    out = tmp_path / "run.json"
    env = clean_env(PYTHONPATH=f"{tmp_path}:{REPO_ROOT}")
    env.pop("CI", None)
    args = ["-p", "ckptspec.spec.harness.plugin", "--rootdir", str(tmp_path), "-p", "no:cacheprovider"]
    run = run_pytest(
        [*args, "--impl", "checked_adapter", "--conformance-json", str(out), "test_checked.py"], tmp_path, env=env
    )
    assert run.code == 1, run.describe()
    assert "INTERNALERROR" not in run.output, run.describe()
    tests = {t["nodeid"].split("::")[1]: t for t in json.loads(out.read_text())["tests"]}
    assert {name: t["outcome"] for name, t in tests.items()} == {
        "test_fits_its_entry": "xfail",
        "test_fails_otherwise": "failed",
        "test_fits_by_message": "xfail",
    }, run.describe()
    fits = tests["test_fits_its_entry"]
    assert fits["clauses"] == ["AQ-3", "AQ-4"], fits
    assert fits["entry"]["clauses"] == ["AQ-4"], fits
    assert fits["failure"]["type"] == "TypeError", fits
    assert "unexpected keyword" in fits["failure"]["text"], fits
    assert tests["test_fits_by_message"]["entry"]["verdict"] == "documented-otherwise"
    stale = "stale expectations entry for test_checked.py::test_fails_otherwise [AQ-3]"
    assert stale in tests["test_fails_otherwise"]["message"], tests["test_fails_otherwise"]
    assert "raises TypeError" in tests["test_fails_otherwise"]["message"]
    assert "ValueError: a different bug" in tests["test_fails_otherwise"]["message"]
