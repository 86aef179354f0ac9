"""Sessions beyond the CI run, each in its own virtual environment (`pip install nox`, then `nox -s NAME`).

    tests-3.11 / tests-3.12 / tests-3.13   the README's two set-up commands, verbatim, on that Python
    lowest                                 the suite on the lowest declared version of every dependency
    lint                                   ruff (lint, format), mypy, import layers, deptry: what .ci/run checks
    mutation                               cosmic-ray over impl on a random sample of 200 mutants, each judged by
                                           the tests that ran its lines first (not in CI; about 2 hours on 2
                                           cores): writes mutation/results.json, then `python -m mutation.summary
                                           --update docs/spec-design.md` (`-- --sample 0` runs every mutant, `-- --resume`
                                           goes on with a stopped run, `-- --rejudge` re-runs the survivors)
    spec(nvrx-0.4.1) / spec(nvrx-0.7.0) /  spec_tests against one release of a target, on the Python that
    spec(mcore-0.16.1) / spec(mcore-0.19.2) release needs; writes conformance/<target>-<release>.json
                                           `-- fault_injection` runs the fault suite instead (writes
                                           conformance/faults-<target>-<release>.json), `-- benchmarks ...` the
                                           benchmarks; other posargs go to pytest (`-- -n 2`)
    launched                               spec_tests on two torchrun "nodes" of this machine (2 x 4 ranks, loopback)
                                           against impl, compared verdict by verdict with a forked run (issue 19)

The conformance table of the releases run here: `python -m spec_tests.harness.report conformance/*.json`; of the
stored runs: `python regenerate.py` (docs/results.md).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
RUN_OPTIONS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["ckptspec"]["run-options"]
TORCH = "torch==2.13.0"  # the README's pin: pip must never resolve a newer, CUDA-sized torch
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


# target -> its pip distribution; (target, release, Python): the releases docs/results.md reports on.
DISTRIBUTIONS = {
    "nvrx": "nvidia-resiliency-ext",
    "mcore": "megatron-core",
    "lightning": "pytorch-lightning",
    "torchtitan": "torchtitan",
}
RELEASES = [
    ("nvrx", "0.4.1", "3.11"),
    ("nvrx", "0.7.0", "3.12"),
    ("mcore", "0.16.1", "3.11"),
    ("mcore", "0.19.2", "3.12"),
    # Protocol-only targets (run `-- spec_tests/protocol fault_injection --conformance-json ...`): Lightning's
    # AsyncCheckpointIO, 2.6.6 and 2.5.3 (the last release before the clone of #21079), and torchtitan's
    # CheckpointManager (async_mode "async"; "async_with_pinned_mem" needs an accelerator, spec_tests/targets/_torchtitan.py).
    ("lightning", "2.6.6", "3.11"),
    ("lightning", "2.5.3", "3.11"),
    ("torchtitan", "0.3.0", "3.11"),
]
# NVRx 0.7.0 ships only manylinux_2_39 cp312 wheels (pip refuses them on an older glibc); its checkpointing package
# needs none of its declared dependencies but these (torch and numpy come with the project).
NVRX_070_WHEEL = ["--no-deps", "--only-binary=:all:", "--python-version", "3.12", "--platform", "manylinux_2_39_x86_64"]
NVRX_070_NEEDS = ["psutil", "packaging", "pyyaml"]


RELEASE_IDS = [nox.param(python, target, release, id=f"{target}-{release}") for target, release, python in RELEASES]


def _install_release(session: nox.Session, target: str, release: str) -> None:
    """The project, then `release` of `target`; fails unless that release is what `target` imports."""
    session.install(TORCH, "-e", ".[test]")
    dist = DISTRIBUTIONS[target]
    if (target, release) == ("nvrx", "0.7.0"):
        session.install(*NVRX_070_NEEDS)
        # run_install, not run: these are install steps, which --install-only must still take.
        site = session.run_install(
            "python", "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])", silent=True
        )
        session.run_install(
            "python", "-m", "pip", "install", *NVRX_070_WHEEL, "--target", str(site).strip(), f"{dist}=={release}"
        )
    else:
        # A constraints file holds torch at the README's pin while pip resolves the release's own dependencies.
        constraints = Path(session.create_tmp()) / "torch-constraints.txt"
        constraints.write_text(TORCH + "\n")
        session.install("-c", str(constraints), f"{dist}=={release}")
    # The report names the version the run imported; refuse to label a run with a release it did not test.
    imported = session.run(
        "python",
        "-c",
        f"from spec_tests.harness.targets import load_target; print(load_target({target!r}).version)",
        silent=True,
    )
    if imported is None:  # --install-only: nothing was run
        return
    imported = str(imported).strip().splitlines()[-1]
    if imported != release:
        session.error(f"{target}: imported version {imported}, expected {release}")


# The suites a release session can run, and the conformance JSON each writes by default ({} = target-release).
SUITES = {"spec_tests": "{}.json", "fault_injection": "faults-{}.json", "benchmarks": None}


@nox.session
@nox.parametrize(("python", "target", "release"), RELEASE_IDS)
def spec(session: nox.Session, target: str, release: str) -> None:
    """A suite (spec_tests unless the first posarg names another of SUITES, or a path inside one) against one
    release of a target.

    Its expectations entries for that release apply (strict). A whole suite records to conformance/ (SUITES) unless
    the posargs give --conformance-json (a path records only there); the other posargs go to pytest, e.g.
    `nox -s "spec(nvrx-0.7.0)" -- fault_injection/test_node_faults.py --conformance-json conformance/rerun.json`.
    """
    _install_release(session, target, release)
    args = list(session.posargs)
    suite = args.pop(0) if args and args[0].split("/")[0] in SUITES else "spec_tests"
    json_name = SUITES.get(suite)
    record = []
    if json_name and "--conformance-json" not in args:
        record = ["--conformance-json", str(ROOT / "conformance" / json_name.format(f"{target}-{release}"))]
    session.run(
        "python",
        "-m",
        "pytest",
        suite,
        *RUN_OPTIONS,
        "--impl",
        target,
        *record,
        *args,
        env={"HYPOTHESIS_PROFILE": "ci"},
    )


@nox.session(python="3.11")
def launched(session: nox.Session) -> None:
    """spec_tests on two torchrun "nodes" of this machine (loopback, gloo) against impl, compared with a forked run.

    World of 8 (2 launches x 4 ranks: the suite's largest bodies); the verdicts of every test and clause must agree.
    Posargs replace the selection and options (`nox -s launched -- spec_tests/storage -q`).
    """
    session.install(TORCH, "-e", ".[test]")
    json_path = ROOT / "conformance" / "impl-launched.json"
    args = session.posargs or ["spec_tests", "-q", "-p", "no:randomly"]
    session.run(
        "python",
        "-m",
        "spec_tests.harness.loopback",
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
