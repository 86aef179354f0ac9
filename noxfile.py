"""Sessions beyond the CI run, each in its own virtual environment (`pip install nox`, then `nox -s NAME`).

    tests-3.11 / tests-3.12 / tests-3.13   the README's two set-up commands, verbatim, on that Python
    lowest                                 the suite on the lowest declared version of every dependency
    lint                                   ruff (lint, format), mypy, deptry: what .ci/run checks
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
TORCH = "torch==2.13.0"  # the README's pin: pip must never resolve a newer, CUDA-sized torch
nox.options.sessions = ["tests", "lint"]


def _readme_commands(session: nox.Session) -> list[str]:
    out = session.run("python", str(ROOT / ".ci" / "readme_commands.py"), silent=True, external=True)
    return str(out).strip().splitlines()


@nox.session(python=["3.11", "3.12", "3.13"])
def tests(session: nox.Session) -> None:
    """The README's "Set up and run" block, line by line, as a new user runs it."""
    for command in _readme_commands(session):
        session.run("bash", "-c", command, external=True)


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
    session.run("deptry", ".")
