"""A target that cannot run is not judged (issue 61 item 5).

Two fake libraries, each installed (a package and its dist-info) in a temporary directory on PYTHONPATH, with an
adapter written as an outside author would: one whose package fails to import (a dependency missing, as torchtitan
0.2.2 without triton), and one whose manager class moved (the adapter imports a name the release no longer has).
The first stops the run, and `ckptspec judge`, with one line naming the cause and the installed version; the
second's tests read "not judged (could not set up)", never a break, and the judge's summary says so.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from ckptspec import cli
from ckptspec.report import advice, verdicts
from ckptspec.report import clauses as clause_registry
from ckptspec.report.provenance import NO_EXPECTATIONS_VAR
from ckptspec.report.report import clause_verdict
from ckptspec.report.runs import load_run
from harness_tests.pytest_runs import REPO_ROOT, clean_env, run_pytest

_ADAPTER = """\
from ckptspec.spec.targets.impl import CAPABILITIES, MODULES, protocol_saver  # noqa: F401
NAME = "{name}_adapter"
DISTRIBUTION = "{name}"
PACKAGES = ("{name}",)
EXPECTATIONS = None


def checkpoint_manager(root, keep):
    from {name}.managers import CheckpointManager  # the adapter's knowledge of the release's API

    return CheckpointManager(root, keep)
"""
_TESTS = """\
import pytest


@pytest.mark.spec("MG-RESUME-1")
def test_resume(target, tmp_path):
    manager = target.adapter.checkpoint_manager(str(tmp_path), 0)
    assert manager.resume({}) is None


@pytest.mark.spec("MG-KEEP-1")
def test_keep(target, tmp_path):
    target.adapter.checkpoint_manager(str(tmp_path), 1)
"""


def _install(root: Path, name: str, version: str, init: str, managers: str) -> None:
    """A package `name` and the dist-info of its distribution, as pip leaves them in site-packages."""
    (root / name).mkdir()
    (root / name / "__init__.py").write_text(init)
    (root / name / "managers.py").write_text(managers)
    info = root / f"{name}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    (info / "top_level.txt").write_text(f"{name}\n")
    (root / f"{name}_adapter.py").write_text(_ADAPTER.format(name=name))
    (root / "test_setup.py").write_text(_TESTS)


def test_a_library_that_fails_to_import_stops_the_run_naming_the_cause_and_version(tmp_path):
    _install(tmp_path, "brokenlib", "0.9.1", "import missing_dependency_xyz\n", "class CheckpointManager: ...\n")
    env = clean_env(PYTHONPATH=f"{tmp_path}:{REPO_ROOT}")
    args = ["-p", "ckptspec.spec.harness.plugin", "--rootdir", str(tmp_path), "-p", "no:cacheprovider"]
    run = run_pytest([*args, "--impl", "brokenlib_adapter", "test_setup.py"], tmp_path, env=env)
    run.assert_clean_failure("brokenlib 0.9.1", "No module named 'missing_dependency_xyz'", "nothing was judged")

    judge = [sys.executable, "-m", "ckptspec.cli", "judge", "brokenlib_adapter", "--out", str(tmp_path / "out")]
    done = subprocess.run(judge, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False)
    assert done.returncode != 0, done
    assert "brokenlib 0.9.1" in done.stderr, done.stderr
    assert "missing_dependency_xyz" in done.stderr, done.stderr
    assert "nothing was judged" in done.stderr, done.stderr
    assert "Breaks" not in done.stdout + done.stderr, "no clause is charged with a library that never ran"


def test_a_manager_class_that_moved_is_not_judged_and_never_a_break(tmp_path):
    _install(tmp_path, "movedlib", "2.0.0", "", "class NewCheckpointManager: ...\n")
    out = tmp_path / "run.json"
    # As `ckptspec judge` runs a version with no recorded run: no expectations, every failure as it happened.
    env = clean_env(PYTHONPATH=f"{tmp_path}:{REPO_ROOT}", **{NO_EXPECTATIONS_VAR: "no recorded run"})
    args = ["-p", "ckptspec.spec.harness.plugin", "--rootdir", str(tmp_path), "-p", "no:cacheprovider"]
    run = run_pytest(
        [*args, "--impl", "movedlib_adapter", "--conformance-json", str(out), "test_setup.py"], tmp_path, env=env
    )
    assert run.code == 1, run.describe()
    recorded = load_run(out)
    registry = clause_registry.load()
    for cid in ("MG-RESUME-1", "MG-KEEP-1"):
        assert clause_verdict(recorded, cid, registry).word == verdicts.NOT_SET_UP, cid
    assert all("cannot import name 'CheckpointManager'" in r.setup_failure for r in recorded.tests.values())
    text = cli.summary(recorded, registry, advice.load(registry), recorded=False, wall_s=1.0)
    assert "Could not set up the library for the tests of 2 clauses" in text, text
    assert "cannot import name 'CheckpointManager'" in text, text
    assert "Breaks" not in text, text
    assert "Failed tests" not in text, text
    assert "Every test passed for 0 clauses." in text, text
    assert cli.set_up_failed(recorded), "judge's exit status says no test could set the library up"
