"""Sessions beyond the CI run, each in its own virtual environment (`pip install nox`, then `nox -s NAME`).

    tests-3.11 / tests-3.12 / tests-3.13   the README's two set-up commands, verbatim, on that Python
    lowest                                 the suite on the lowest declared version of every dependency
    torch(2.11) ... torch(2.15)            the README suite (`pytest -n auto`) on that torch release (the newest patch),
                                           as on a machine that already has it: its Linux wheel is the CUDA build
                                           (several GB, runs on a CPU too); install once, then `nox -R -s "torch(2.11)"`
                                           reuses the environment. Posargs replace pytest's (`-- ckptspec/spec -q`)
    lint                                   ruff (lint, format), mypy, import layers, deptry: what .ci/run checks
    mutation                               cosmic-ray over impl on a random sample of 200 mutants, each judged by
                                           the tests that ran its lines first (not in CI; about 2 hours on 2
                                           cores): writes mutation/results.json, then `python -m mutation.summary
                                           --update docs/spec-design.md` (`-- --sample 0` runs every mutant, `-- --resume`
                                           goes on with a stopped run, `-- --rejudge` re-runs the survivors)
    spec(NAME)                             ckptspec/spec against one release of ckptspec/report/releases.py (NAME:
                                           nvrx-0.4.1, dcp-thread-2.13.0, ...), on the Python that release needs;
                                           writes conformance/NAME.json
                                           `-- ckptspec/faults` runs the fault suite instead (writes
                                           conformance/faults-NAME.json), `-- ckptspec/bench ...` the
                                           benchmarks; other posargs go to pytest (`-- -n 2`)
    record(NAME)                           the release's recorded run: both suites into its stored run
                                           conformance/all/NAME.json, then `python regenerate.py`
    launched                               ckptspec/spec on two torchrun "nodes" of this machine (2 x 4 ranks, loopback)
                                           against impl, compared verdict by verdict with a forked run (issue 19)

The conformance table of the releases run here: `python -m ckptspec.report.report conformance/*.json`; of the
stored runs: `python regenerate.py` (docs/results.md).
"""

from __future__ import annotations

import os
import re
import sys
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))  # this tree's release list, whatever the Python that runs nox has installed
from ckptspec.report import releases  # noqa: E402

RUN_OPTIONS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ckptspec"]["run-options"]
TORCH = f"torch=={releases.TORCH}"  # the README's pin: pip must never resolve a newer, CUDA-sized torch
nox.options.sessions = ["tests", "lint"]


def _readme_commands(session: nox.Session) -> list[str]:
    out = session.run("python", str(ROOT / ".ci" / "readme_commands.py"), silent=True, external=True)
    return str(out).strip().splitlines()


@nox.session(python=["3.11", "3.12", "3.13"])
def tests(session: nox.Session) -> None:
    """The README's "Set up and run" block, line by line, as a new user runs it; then the harness's own tests."""
    for command in _readme_commands(session):
        session.run("bash", "-c", command, external=True)
    session.run("pytest", "-n", "auto", "harness_tests", external=True)


def lowest_requirements() -> list[str]:
    """Each `name>=X` of the project's dependencies and test extra, as `name==X`."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = project["dependencies"] + project["optional-dependencies"]["test"]
    pinned = [re.sub(r">=", "==", req) for req in declared]
    return [TORCH if req.startswith("torch") else req for req in pinned]


@nox.session(python="3.11")
def lowest(session: nox.Session) -> None:
    """The whole suite with every dependency at its declared lower bound."""
    session.install(*lowest_requirements())
    session.install("--no-deps", "-e", ".")
    session.run("pytest", "-n", "auto", *session.posargs)


# The torch releases the suite supports (SUPPORTED_TORCH in ckptspec/spec/harness/surface/loading.py is the first):
# one `torch(X.Y)` session each. Not in CI (its 20 minutes hold one suite run); run by a developer changing torch-bound
# code, or before moving the range.
TORCH_RANGE = ["2.11", "2.12", "2.13", "2.14", "2.15"]


@nox.session(python="3.11")
@nox.parametrize("version", TORCH_RANGE, ids=TORCH_RANGE)
def torch(session: nox.Session, version: str) -> None:
    """The README's suite command on torch `version`.*, installed first and the project on it without a pin, as a
    user whose machine has that torch runs `pip install -e ".[test]"`."""
    # A machine's pip may cap torch (a `[global] constraint` file in its pip configuration); an empty constraints
    # file in its place lifts the cap for these installs only, so a release newer than the cap installs. (An empty
    # PIP_CONSTRAINT does not: pip reads an empty variable as unset.)
    env = {"PIP_CONSTRAINT": os.devnull}
    session.install(f"torch=={version}.*", env=env)
    session.install("-e", ".[test]", env=env)
    installed = session.run("python", "-c", "import torch; print(torch.__version__)", silent=True)
    if installed is not None and not str(installed).strip().startswith(version + "."):
        session.error(f"installed torch {str(installed).strip()}, expected {version}.*")
    if session.posargs:
        session.run("pytest", *session.posargs)
    else:
        session.run("bash", "-c", _readme_commands(session)[-1], external=True)  # `pytest -n auto`


@nox.session(python="3.11")
def lint(session: nox.Session) -> None:
    session.install(TORCH, "-e", ".[test,lint]")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run("lint-imports")
    session.run("deptry", ".")


@nox.session(python="3.11")
def mutation(session: nox.Session) -> None:
    """The mutation score of impl: cosmic-ray on a seeded random sample, coverage-selected tests per mutant."""
    session.install(TORCH, "-e", ".[test,mutation]")
    session.run(
        "python", "-m", "mutation.run", *(session.posargs or ["--sample", "200", "--seed", "17", "--jobs", "2"])
    )
    session.run("python", "-m", "mutation.summary")


# The releases (ckptspec/report/releases.py): one `spec(NAME)` and one `record(NAME)` session each.
RELEASE_IDS = [nox.param(r.python, r.name, id=r.name) for r in releases.RELEASES]


def _release_env(session: nox.Session) -> dict[str, str]:
    """The environment of a release's pytest run: derandomized hypothesis, and torch's JIT extension builds (DeepSpeed
    compiles its ops on first use) kept in this session's own venv: under the shared ~/.cache/torch_extensions a build
    killed midway leaves a lock that every later process of every venv waits on for ever."""
    return {
        "HYPOTHESIS_PROFILE": "ci",
        "TORCH_EXTENSIONS_DIR": str(Path(session.virtualenv.location) / "torch_extensions"),
    }


def _install_release(session: nox.Session, release: releases.Release) -> None:
    """The project with the release's torch, then the release; fails unless that release is what its target imports."""
    torch = f"torch=={release.torch}"
    session.install(torch, "-e", ".[test]")
    if release.wheel_only:
        session.install(*release.needs)
        # run_install, not run: these are install steps, which --install-only must still take.
        site = session.run_install(
            "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True
        )
        session.run_install(
            "python",
            "-m",
            "pip",
            "install",
            "--no-deps",
            *release.wheel_only,
            "--target",
            str(site).strip(),
            release.requirement,
        )
    elif release.distribution != "torch":
        # A constraints file holds torch at the release's pin while pip resolves the release's own dependencies.
        constraints = Path(session.create_tmp()) / "torch-constraints.txt"
        constraints.write_text(torch + "\n")
        # `needs` beside it: what its imports need that its wheel does not declare (torchtitan 0.2.2's triton).
        session.install("-c", str(constraints), release.requirement, *release.needs)
    # The report names the version the run imported; refuse to label a run with a release it did not test.
    imported = session.run(
        "python",
        "-c",
        f"from ckptspec.spec.harness.surface.loading import load_target; print(load_target({release.target!r}).version)",
        silent=True,
    )
    if imported is None:  # --install-only: nothing was run
        return
    imported = str(imported).strip().splitlines()[-1]
    if releases.base_version(imported) != release.version:
        session.error(f"{release.target}: imported version {imported}, expected {release.version}")


# The suites a release session can run, and the conformance JSON each writes by default ({} = target-release).
SUITES = {"ckptspec/spec": "{}.json", "ckptspec/faults": "faults-{}.json", "ckptspec/bench": None}


def _suite_of(path: str) -> str | None:
    """The suite of SUITES that `path` is or lies in."""
    return next((suite for suite in SUITES if path == suite or path.startswith(suite + "/")), None)


@nox.session
@nox.parametrize(("python", "name"), RELEASE_IDS)
def spec(session: nox.Session, name: str) -> None:
    """A suite (ckptspec/spec unless the first posarg names another of SUITES, or a path inside one) against one
    release of a target.

    Its expectations entries for that release apply (strict). A whole suite records to conformance/ (SUITES) unless
    the posargs give --conformance-json (a path records only there); the other posargs go to pytest, e.g.
    `nox -s "spec(nvrx-0.7.0)" -- ckptspec/faults/test_node_faults.py --conformance-json conformance/rerun.json`.
    """
    release = releases.by_name()[name]
    _install_release(session, release)
    args = list(session.posargs)
    suite = args.pop(0) if args and _suite_of(args[0]) in SUITES else "ckptspec/spec"
    json_name = SUITES.get(suite)
    record = []
    if json_name and "--conformance-json" not in args:
        record = ["--conformance-json", str(ROOT / "conformance" / json_name.format(name))]
    session.run(
        "python",
        "-m",
        "pytest",
        suite,
        *RUN_OPTIONS,
        "--impl",
        release.target,
        *record,
        *args,
        env=_release_env(session),
    )


@nox.session
@nox.parametrize(("python", "name"), RELEASE_IDS)
def record(session: nox.Session, name: str) -> None:
    """Record a release's run (its suites, releases.SUITES) as its stored run conformance/all/NAME.json, then
    regenerate every table and page from the stored runs (`python regenerate.py`).

    What adding a release takes after its entry in ckptspec/report/releases.py. Posargs go to pytest (`-- -n 2`).
    """
    release = releases.by_name()[name]
    _install_release(session, release)
    stored = ROOT / release.stored_run
    session.run(
        "python",
        "-m",
        "pytest",
        *releases.SUITES,
        *RUN_OPTIONS,
        "--impl",
        release.target,
        "--conformance-json",
        str(stored),
        *session.posargs,
        env=_release_env(session),
        success_codes=[0, 1],  # failures are verdicts; the run is stored either way
    )
    session.run("python", "regenerate.py")


@nox.session(python="3.11")
def launched(session: nox.Session) -> None:
    """ckptspec/spec on two torchrun "nodes" of this machine (loopback, gloo) against impl, compared with a forked run.

    World of 8 (2 launches x 4 ranks: the suite's largest bodies); the verdicts of every test and clause must agree.
    Posargs replace the selection and options (`nox -s launched -- ckptspec/spec/storage -q`).
    """
    session.install(TORCH, "-e", ".[test]")
    json_path = ROOT / "conformance" / "impl-launched.json"
    args = session.posargs or ["ckptspec/spec", "-q", "-p", "no:randomly"]
    session.run(
        "python",
        "-m",
        "ckptspec.spec.harness.ranks.loopback",
        "--nodes",
        "2",
        "--nproc-per-node",
        "4",
        "--forked",
        "--",
        *args,
        "--conformance-json",
        str(json_path),
        env={"HYPOTHESIS_PROFILE": "ci"},
    )
