"""`python -m ckptspec.migrate` (issue 59): 0.2's four top-level names rewritten to `ckptspec.*`, and nothing else.

The rewrite is what migrated this tree's stored runs and expectations files, and what a user runs over their own;
a wrong rule would rename a target (`impl`), a page (`docs/benchmarks.md`) or pytest-benchmark's folder, so each
case that must stay as it is is pinned beside each that must change. The tree itself has no 0.2 name left outside
the changelog's old sections and the migration module's own description.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from ckptspec.migrate import main, migrate_text
from harness_tests.pytest_runs import REPO_ROOT

REWRITTEN = [
    (
        "spec_tests/async_ckpt/test_queue.py::test_x[persistent]",
        "ckptspec/spec/async_ckpt/test_queue.py::test_x[persistent]",
    ),
    ("fault_injection/test_storage_faults.py::t", "ckptspec/faults/test_storage_faults.py::t"),
    ("benchmarks/test_save.py::test_save[dcp:impl]", "ckptspec/bench/test_save.py::test_save[dcp:impl]"),
    (
        "from spec_tests.harness.target.loading import SPEC_MODULES",
        "from ckptspec.spec.harness.surface.loading import SPEC_MODULES",
    ),
    ("from benchmarks import summary", "from ckptspec.bench import summary"),
    ("import fault_injection", "import ckptspec.faults"),
    ("python -m benchmarks.regression compare", "python -m ckptspec.bench.regression compare"),
    ("-p spec_tests.harness.plugin", "-p ckptspec.spec.harness.plugin"),
    ("from impl.async_ckpt import core", "from ckptspec.impl.async_ckpt import core"),
    ('"impl.async_ckpt.core"', '"ckptspec.impl.async_ckpt.core"'),
    ("see impl/async_ckpt/core.py:12", "see ckptspec/impl/async_ckpt/core.py:12"),
    ("[the regression pass](../benchmarks/README.md)", "[the regression pass](../ckptspec/bench/README.md)"),
    ('File "/work/wt/spec_tests/harness/plugin.py", line 3', 'File "/work/wt/ckptspec/spec/harness/plugin.py", line 3'),
    ("runs spec_tests and fault_injection", "runs ckptspec/spec and ckptspec/faults"),
]
KEPT = [
    "--impl impl",
    "conformance/all/impl.json",
    "ckptspec/spec/targets/impl.expectations.toml",
    "dcp:impl-overlapped",
    "docs/impl.md",
    "docs/benchmarks.md",
    "[figures](benchmarks.md#gpu-runs)",
    "docs/examples/benchmarks.yml",
    ".benchmarks/",
    "the benchmarks. Then",
    'run["benchmarks"]',
    "torch/utils/benchmark/utils/timer.py",
    "my_benchmarks/x.py",
]


@pytest.mark.parametrize(("old", "new"), REWRITTEN, ids=[old for old, _ in REWRITTEN])
def test_an_old_name_becomes_its_new_name_once(old, new):
    assert migrate_text(old) == new
    assert migrate_text(new) == new


@pytest.mark.parametrize("text", KEPT)
def test_target_names_pages_and_words_stay_as_they_are(text):
    assert migrate_text(text) == text


def test_check_reports_a_file_with_an_old_name_and_rewrite_fixes_it(tmp_path, capsys):
    stale, clean = tmp_path / "mylib.expectations.toml", tmp_path / "run.json"
    stale.write_text('test = "spec_tests/protocol/test_snapshot.py::t"\n')
    clean.write_text('{"nodeid": "ckptspec/spec/protocol/test_snapshot.py::t"}\n')
    assert main(["--check", str(tmp_path)]) == 1
    assert str(stale) in capsys.readouterr().out
    assert stale.read_text() == 'test = "spec_tests/protocol/test_snapshot.py::t"\n', "--check changed a file"
    assert main([str(tmp_path)]) == 0
    assert stale.read_text() == 'test = "ckptspec/spec/protocol/test_snapshot.py::t"\n'
    assert main(["--check", str(tmp_path)]) == 0


def test_a_missing_path_is_named_and_nothing_is_written(tmp_path):
    with pytest.raises(SystemExit, match="no-such"):
        main([str(tmp_path / "no-such")])


def test_the_tree_has_no_old_name_left():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    # The changelog's old sections keep the names they were written with; the migration module describes them.
    left = {"CHANGELOG.md", "ckptspec/migrate.py", "harness_tests/test_migrate.py"}
    paths = [p for p in tracked.stdout.split() if p not in left and (REPO_ROOT / p).is_file()]
    done = subprocess.run(
        [sys.executable, "-m", "ckptspec.migrate", "--check", *paths], cwd=REPO_ROOT, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout[-3000:]
