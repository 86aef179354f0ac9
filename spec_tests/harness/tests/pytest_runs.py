"""Starting pytest on this repository in a subprocess, for the meta tests of the harness.

`run_pytest(args, cwd=...)` runs `python -m pytest ARGS` (or the `pytest` script) with a clean environment (no
CKPTSPEC_* or PYTEST_* variable of the outer run, xdist's `auto` bounded to 2 workers) and a timeout, and
returns a `Run`: exit status, output, and, with `probe=True`, what each collecting process collected
(spec_tests.harness.tests.collect_probe).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from spec_tests.harness.tests import collect_probe

REPO_ROOT = Path(__file__).resolve().parents[3]
PYTEST_SCRIPT = Path(sys.executable).with_name("pytest")
TIMEOUT_S = 240
# Exit statuses that mean pytest itself broke: an internal error, or a crash (negative: a signal).
BROKEN = (3,)


@dataclass
class Run:
    args: list[str]
    code: int
    output: str
    collected: dict[str, list[str]] = field(default_factory=dict)  # "main" or worker id -> node ids

    def describe(self) -> str:
        tail = "\n".join(self.output.splitlines()[-25:])
        return f"$ pytest {' '.join(self.args)}  -> exit {self.code}\n{tail}"

    @property
    def error_lines(self) -> list[str]:
        """The lines of a usage error (`ERROR: ...`)."""
        return [line for line in self.output.splitlines() if line.startswith("ERROR: ")]

    def assert_clean_failure(self, *fragments: str) -> None:
        """pytest refused the input with one clear line holding `fragments`: no traceback, no internal error."""
        __tracebackhide__ = True
        assert self.code not in (0, *BROKEN), self.describe()
        assert self.code > 0, self.describe()
        assert "Traceback" not in self.output, self.describe()
        assert "INTERNALERROR" not in self.output, self.describe()
        lines = [line for line in self.output.splitlines() if all(f in line for f in fragments)]
        assert lines, f"no line holds {fragments}\n{self.describe()}"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTSPEC_", "PYTEST_"))}
    env["PYTEST_XDIST_AUTO_NUM_WORKERS"] = "2"
    env.update(extra)
    return env


def run_pytest(
    args: list[str],
    cwd: Path = REPO_ROOT,
    *,
    script: bool = False,
    probe: bool = False,
    env: dict[str, str] | None = None,
    timeout: float = TIMEOUT_S,
) -> Run:
    """Run pytest with `args` in `cwd`; see the module docstring."""
    command = [str(PYTEST_SCRIPT)] if script else [sys.executable, "-m", "pytest"]
    env = dict(env or clean_env())
    with tempfile.TemporaryDirectory(prefix="ckptspec-probe-") as out:
        if probe:
            env[collect_probe.ENV_VAR] = out
            args = [*args, "-p", collect_probe.__name__]
        done = subprocess.run(
            [*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
        )
        collected = {path.stem: path.read_text().splitlines() for path in Path(out).glob("*.txt")}
    return Run(args, done.returncode, done.stdout + done.stderr, collected)
