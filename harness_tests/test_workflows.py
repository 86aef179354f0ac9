"""The reusable workflows (.github/workflows/conformance.yml, cost-gate.yml) and the examples that call them
(docs/examples/*.yml), tested as the examples were (issue 51 item 2):

- each file passes GitHub's workflow schema (check-jsonschema's vendored copy), and a broken copy does not;
- each example calls its reusable workflow pinned at the release tag (`@v` + pyproject's version), with every
  required input and no input the workflow does not declare; each workflow installs that same release by default;
- each command a workflow runs parses with the command line it calls (`ci_job`, `ckptspec.bench.regression`);
- the conformance workflow's steps run here for real: `ci_job run` against the example adapter on one test
  (expectations from $CKPTSPEC_EXPECTATIONS), then `ci_job summary` beside a stored run, into a summary file.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from ckptspec.bench.regression.__main__ import parser as regression_parser
from ckptspec.report import releases
from ckptspec.spec.harness import ci_job
from harness_tests.pytest_runs import REPO_ROOT, clean_env

WORKFLOWS = REPO_ROOT / ".github" / "workflows"
EXAMPLES = REPO_ROOT / "docs" / "examples"
REUSABLE = {"conformance.yml": "conformance.yml", "benchmarks.yml": "cost-gate.yml"}  # example -> workflow
TAG = "v" + tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
SCHEMA = ["--builtin-schema", "vendor.github-workflows"]
ONE_TEST = "test_state_may_change_once_staged_returns"  # the conformance steps' run: one protocol test
FILES = [*sorted(WORKFLOWS.glob("*.yml")), *sorted(EXAMPLES.glob("*.yml"))]


def _load(path: Path) -> dict[str, Any]:
    data: dict[Any, Any] = yaml.safe_load(path.read_text())
    data["on"] = data.pop(True, data.get("on"))  # YAML 1.1 reads the key `on` as true
    return data


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(REPO_ROOT).as_posix())
def test_each_workflow_passes_the_schema_and_a_broken_copy_does_not(path, tmp_path):
    beside = Path(sys.executable).with_name("check-jsonschema")  # the venv's, when it is not on PATH
    tool = shutil.which("check-jsonschema") or (str(beside) if beside.exists() else None)
    if tool is None:
        pytest.skip("check-jsonschema is not installed (the `test` extra)")
    done = subprocess.run([tool, *SCHEMA, str(path)], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    broken = tmp_path / path.name
    broken.write_text(path.read_text().replace("jobs:", "job:", 1))
    assert subprocess.run([tool, *SCHEMA, str(broken)], capture_output=True, timeout=120).returncode != 0


@pytest.mark.parametrize("example", sorted(REUSABLE), ids=str)
def test_each_example_calls_its_reusable_workflow_pinned_with_inputs_it_declares(example):
    workflow = _load(WORKFLOWS / REUSABLE[example])
    declared = workflow["on"]["workflow_call"]["inputs"]
    (job,) = _load(EXAMPLES / example)["jobs"].values()
    owner_repo = declared["ckptspec-repository"]["default"]
    assert job["uses"] == f"{owner_repo}/.github/workflows/{REUSABLE[example]}@{TAG}"
    given = set(job.get("with", {}))
    assert given <= set(declared), f"inputs the workflow does not declare: {given - set(declared)}"
    required = {name for name, spec in declared.items() if spec.get("required")}
    assert required <= given, f"required inputs left out: {required - given}"
    assert declared["ckptspec-ref"]["default"] == TAG
    assert job["with"]["ckptspec-ref"] == TAG


def _runs(path: Path) -> list[str]:
    return [step["run"] for job in _load(path)["jobs"].values() for step in job["steps"] if "run" in step]


def _args(command: str, prefix: str) -> list[list[str]]:
    """The argument lists of each `python -m PREFIX ...` call in a step's script, variables replaced by X."""
    found = []
    for call in re.findall(rf"python -m {re.escape(prefix)} (.*)", " ".join(command.split("\n"))):
        words = shlex.split(re.sub(r"\$\{(\w+):\+([^}]*)\}", r"\2", call))
        found.append([re.sub(r"\$\{\{.*?\}\}|\$\w+", "X", w) for w in words])
    return found


def test_the_workflows_call_the_command_lines_as_they_are():
    conformance = [
        a for run in _runs(WORKFLOWS / "conformance.yml") for a in _args(run, "ckptspec.spec.harness.ci_job")
    ]
    assert {a[0] for a in conformance} == {"run", "summary"}
    for args in conformance:
        ci_job.parser().parse_args(_areas(args))
    gate = [a for run in _runs(WORKFLOWS / "cost-gate.yml") for a in _args(run, "ckptspec.bench.regression")]
    assert {a[0] for a in gate} == {"record", "compare"}
    for args in gate:
        regression_parser().parse_args(args)


def _areas(args: list[str]) -> list[str]:
    """`--areas $AREAS` (several words in CI, one X here) with the default areas in its place."""
    return [*args[: args.index("--areas") + 1], *ci_job.DEFAULT_AREAS, *args[args.index("--areas") + 2 :]]


def test_the_conformance_steps_run_and_write_the_job_summary(tmp_path):
    adapter = tmp_path / "adapter"
    adapter.mkdir()
    for name in ("sync_dcp_adapter.py", "sync_dcp_adapter.expectations.toml"):  # the file the adapter names
        shutil.copy(EXAMPLES / name, adapter)
    expectations = adapter / "mine.expectations.toml"
    shutil.copy(EXAMPLES / "sync_dcp_adapter.expectations.toml", expectations)
    out, summary = tmp_path / "out", tmp_path / "summary.md"
    # This checkout on the path before any other installed copy, as CI's installed copy would be.
    path = os.pathsep.join((str(adapter), str(REPO_ROOT)))
    env = clean_env(PYTHONPATH=path, CKPTSPEC_EXPECTATIONS=str(expectations), HYPOTHESIS_PROFILE="ci")
    run = [sys.executable, "-m", "ckptspec.spec.harness.ci_job", "run", "--adapter", "sync_dcp_adapter"]
    run += ["--out", str(out), "--areas", "protocol", "-n", "0", "--", "-k", ONE_TEST]
    done = subprocess.run(run, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode in (0, 1), done.stdout[-3000:] + done.stderr[-3000:]
    assert (out / "run.json").exists(), done.stdout[-3000:]
    stored = REPO_ROOT / "conformance" / "all"
    summ = [
        sys.executable,
        "-m",
        "ckptspec.spec.harness.ci_job",
        "summary",
        str(out / "run.json"),
        "--areas",
        "protocol",
    ]
    summ += ["--stored", str(stored), "--expectations", str(expectations), "--out", str(summary)]
    done = subprocess.run(summ, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
    text = summary.read_text()
    assert text.startswith("## ckptspec: sync_dcp_adapter 2.13.0"), text[:200]
    header = next(line for line in text.splitlines() if line.startswith("| clause | statement | basis | severity |"))
    # --stored: the reference, then the newest release of each target judged on the area, then the run
    columns = [cell.strip() for cell in header.strip("|").split("|")][4:]
    targets = [releases.REFERENCE, *(r.target for r in releases.newest(("protocol",)))]
    assert [column.split()[0] for column in columns] == [*targets, "sync_dcp_adapter"], columns
    assert "P-STAGED-1" in text


def test_summary_with_a_stored_directory_lacking_a_run_names_it_and_writes_nothing(tmp_path, capsys):
    """`--stored DIR` without one of the runs it shows: exit status 2 naming the file, no summary written."""
    stored = tmp_path / "all"
    stored.mkdir()
    *present, missing = [releases.REFERENCE, *(r.name for r in releases.newest(("protocol",)))]
    for name in present:
        shutil.copy(REPO_ROOT / "conformance" / "all" / f"{name}.json", stored)
    out = tmp_path / "summary.md"
    run = REPO_ROOT / "conformance" / "all" / f"{releases.REFERENCE}.json"
    code = ci_job.main(["summary", str(run), "--areas", "protocol", "--stored", str(stored), "--out", str(out)])
    assert code == 2
    assert f"no stored run {missing}.json" in capsys.readouterr().err
    assert not out.exists()
