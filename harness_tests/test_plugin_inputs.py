"""The plugin checks its inputs, end to end (issues 22 and 14): each bad input is one clear line, never a traceback.

Every case starts pytest in a subprocess: configuration errors (exit status 4, one `ERROR:` line), collection errors
(a wrong citation or capability, in the main process and in xdist workers), expectation entries that match no
test, xfail strictness by hypothesis profile, and the clause notes of a failing test. The helper modules the
cases need (adapters, expectations files, tiny test files) are written to a temporary directory.
"""

from __future__ import annotations

import json

import pytest

from ckptspec.report import clauses as clause_registry
from ckptspec.spec.harness.surface.loading import builtin_targets
from harness_tests.pytest_runs import REPO_ROOT, clean_env, run_pytest

_ADAPTER = """\
from ckptspec.spec.targets.impl import CAPABILITIES, MODULES, checkpoint_manager, protocol_saver  # noqa: F401
from pathlib import Path
NAME = "{name}"
DISTRIBUTION = None
EXPECTATIONS = str(Path(__file__).with_name("{name}.toml"))
"""
_STALE = """\
[[xfail]]
test = "harness_tests/test_discovery.py::test_no_such_test"
clause = "AQ-1"
reason = "names a test that does not exist"

[[xfail]]
test = "ckptspec/spec/async_ckpt/test_queue.py::test_no_such_test"
clause = "AQ-1"
reason = "in a file a run of the harness tests does not collect"
"""
_TINY_TESTS = """\
import pytest
from hypothesis import given, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule, run_state_machine_as_test


class Machine(RuleBasedStateMachine):
    @rule()
    def step(self):
        pass


@pytest.mark.spec("AQ-3")
def test_fails():
    assert 1 == 2


@pytest.mark.spec("AR-1")
@given(st.integers())
def test_hypothesis_listed(x):
    pass


@pytest.mark.spec("AR-2")
def test_machine_listed():
    run_state_machine_as_test(Machine)


@pytest.mark.spec("AR-3")
def test_plain_listed():
    pass
"""
_TINY_EXPECTATIONS = "".join(
    f'[[xfail]]\ntest = "test_tiny.py::{test}"\nclause = "{clause}"\nreason = "listed"\n\n'
    for test, clause in (
        ("test_hypothesis_listed", "AR-1"),
        ("test_machine_listed", "AR-2"),
        ("test_plain_listed", "AR-3"),
    )
)
_BAD_TESTS = """\
import pytest


@pytest.mark.spec("NOPE-1")
def test_unknown_clause():
    pass


@pytest.mark.spec("AQ-1")
@pytest.mark.needs("persistent_calller")
def test_unknown_capability():
    pass
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """A directory on PYTHONPATH with adapters, expectations files, a package blocker and tiny test files."""
    root = tmp_path_factory.mktemp("project")
    files = {
        "stale_adapter.py": _ADAPTER.format(name="stale_adapter"),
        "stale_adapter.toml": _STALE,
        "tiny_adapter.py": _ADAPTER.format(name="tiny_adapter"),
        "tiny_adapter.toml": _TINY_EXPECTATIONS,
        "broken_adapter.py": _ADAPTER.format(name="broken_adapter"),
        "broken_adapter.toml": "[[xfail]]\ntest = 1\n",
        "odd_adapter.py": _ADAPTER.format(name="odd_adapter") + 'CAPABILITIES = frozenset({"teleport"})\n',
        "block_packages.py": 'import sys\nsys.modules["nvidia_resiliency_ext"] = None\nsys.modules["megatron"] = None\n',
        "test_tiny.py": _TINY_TESTS,
        "test_bad.py": _BAD_TESTS,
        "a_file": "",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    return root


def _env(project, **extra):
    """The environment of a run: the project's modules importable, $CI only where a case sets it."""
    env = clean_env(PYTHONPATH=f"{project}:{REPO_ROOT}")
    env.pop("CI", None)
    return {**env, **extra}


# ---------------------------------------------------------------------------------- configuration


BAD_INPUTS = {
    "unknown --impl": (
        ["--impl", "bogus"],
        {},
        [
            "unknown target 'bogus'",
            "known targets: " + ", ".join(sorted(builtin_targets())),
        ],
    ),
    "unknown $CKPTSPEC_IMPL": ([], {"CKPTSPEC_IMPL": "bogus"}, ["unknown target 'bogus'"]),
    "--impl nvrx not installed": (
        ["-p", "block_packages", "--impl", "nvrx"],
        {},
        [
            "target 'nvrx' needs nvidia-resiliency-ext, which cannot be imported",
            'install it with: pip install "torch==2.13.0" -e ".[test,nvrx]"',
        ],
    ),
    "--impl mcore not installed": (
        ["-p", "block_packages", "--impl", "mcore"],
        {},
        [
            "target 'mcore' needs megatron-core, which cannot be imported",
            'install it with: pip install "torch==2.13.0" -e ".[test,mcore]"',
        ],
    ),
    "--impl of a missing adapter module": (
        ["--impl", "no_such_package.adapter"],
        {},
        ["no adapter module 'no_such_package.adapter'"],
    ),
    "adapter with an unknown capability": (["--impl", "odd_adapter"], {}, ["declares unknown capabilities teleport"]),
    "malformed expectations file": (
        ["--impl", "broken_adapter"],
        {},
        ["broken_adapter.toml", "xfail entry 1 needs the fields"],
    ),
    "bad $HYPOTHESIS_PROFILE": (
        [],
        {"HYPOTHESIS_PROFILE": "bogus"},
        ["hypothesis profile 'bogus'", "ci, explore, nightly"],
    ),
    "bad --hypothesis-profile": (["--hypothesis-profile=bogus"], {}, ["hypothesis profile 'bogus'"]),
    "bad $CKPTSPEC_TENSOR_DEVICE": (
        [],
        {"CKPTSPEC_TENSOR_DEVICE": "tpu"},
        ["$CKPTSPEC_TENSOR_DEVICE 'tpu'", "cpu, cuda"],
    ),
    "--conformance-json under a file": (
        ["--conformance-json", "{project}/a_file/out.json"],
        {},
        ["cannot be created", "a_file is not a directory"],
    ),
    "--conformance-json a directory": (["--conformance-json", "{project}"], {}, ["is a directory"]),
}


@pytest.mark.parametrize("case", BAD_INPUTS)
def test_a_bad_input_is_one_clear_line(project, case):
    args, env, fragments = BAD_INPUTS[case]
    args = [a.format(project=project) for a in args]
    run = run_pytest([*args, "--collect-only", "-q", "ckptspec/spec/clauses"], env=_env(project, **env))
    run.assert_clean_failure(*fragments)
    assert run.code == 4, run.describe()
    assert len(run.error_lines) == 1, run.describe()


# ---------------------------------------------------------------------------------- collection


@pytest.mark.parametrize("workers", ["0", "2"])
def test_a_wrong_citation_or_capability_is_a_collection_error(project, workers):
    run = run_pytest(
        ["-p", "ckptspec.spec.harness.plugin", "--rootdir", str(project), "-n", workers, "-q", "test_bad.py"],
        project,
        env=_env(project),
    )
    run.assert_clean_failure("test_bad.py::test_unknown_clause: unknown clause id(s) NOPE-1")
    run.assert_clean_failure("test_bad.py::test_unknown_capability: needs unknown capability persistent_calller")
    assert "passed" not in run.output, run.describe()


_HARNESS_FILE = "harness_tests/test_discovery.py"
_STALE_LINE = f"{_HARNESS_FILE}::test_no_such_test [AQ-1] matches no collected test"


@pytest.mark.parametrize(
    "args",
    [[_HARNESS_FILE, "--collect-only", "-q"], [_HARNESS_FILE, "-n", "1", "-k", "nothing"]],
    ids=["main", "xdist"],
)
def test_an_expectation_matching_no_test_is_reported(project, args):
    run = run_pytest(["--impl", "stale_adapter", *args], env=_env(project))
    assert run.code in (0, 5), run.describe()
    lines = [line for line in run.output.splitlines() if _STALE_LINE in line]
    assert len(lines) == 1, run.describe()
    assert "warning" in lines[0], run.describe()
    assert "test_queue.py" not in run.output, run.describe()  # a file this run did not collect


def test_an_expectation_matching_no_test_is_an_error_in_ci(project):
    run = run_pytest(["--impl", "stale_adapter", _HARNESS_FILE, "--collect-only", "-q"], env=_env(project, CI="true"))
    run.assert_clean_failure(_STALE_LINE)


def test_a_file_narrowed_to_node_ids_is_not_checked(project):
    run = run_pytest(
        ["--impl", "stale_adapter", f"{_HARNESS_FILE}::test_clause_areas_keep_the_table_order", "--collect-only", "-q"],
        env=_env(project, CI="true"),
    )
    assert run.code == 0, run.describe()
    assert "matches no collected test" not in run.output, run.describe()


# ---------------------------------------------------------------------------------- running


@pytest.mark.parametrize("profile", ["explore", "ci"])
def test_xfail_strictness_and_clause_notes(project, profile):
    out = project / f"{profile}.json"
    run = run_pytest(
        [
            "-p",
            "ckptspec.spec.harness.plugin",
            "--rootdir",
            str(project),
            "-p",
            "no:cacheprovider",
            "--impl",
            "tiny_adapter",
            "--conformance-json",
            str(out),
            "test_tiny.py",
        ],
        project,
        env=_env(project, HYPOTHESIS_PROFILE=profile),
    )
    assert run.code == 1, run.describe()
    assert "INTERNALERROR" not in run.output, run.describe()
    outcomes = {t["nodeid"].split("::")[1]: t for t in json.loads(out.read_text())["tests"]}
    randomized = "xpass" if profile == "explore" else "failed"  # explore is randomized: a pass may be luck
    assert {name: t["outcome"] for name, t in outcomes.items()} == {
        "test_fails": "failed",
        "test_hypothesis_listed": randomized,
        "test_machine_listed": randomized,
        "test_plain_listed": "failed",
    }, run.describe()
    note = f"[AQ-3] {clause_registry.load()['AQ-3']['statement']}"
    assert note in run.output, run.describe()
    assert note in outcomes["test_fails"]["message"], run.describe()
