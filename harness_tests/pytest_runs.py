"""Starting pytest on this repository in a process of its own, for the meta tests of the harness.

`run_pytest(args, cwd=...)` runs pytest with ARGS in a process of its own, with a clean environment (no
CKPTSPEC_* or PYTEST_* variable of the outer run, xdist's `auto` bounded to 2 workers) and a timeout, and
returns a `PytestRun`: exit status, output, and, with `probe=True`, what each collecting process collected
(harness_tests.collect_probe).

By default the process is forked from a server that has already imported torch, pytest, hypothesis and the
suite's plugin, and calls `pytest.main(ARGS)` there, as `python -m pytest ARGS` would (the working directory, the
environment and PYTHONPATH as given; the output is stdout and stderr, merged): a run then costs its own work, not
seconds of interpreter start and imports. `script=True` starts the `pytest` script and `fresh=True` a new
`python -m pytest` interpreter, for what depends on how the interpreter starts.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from harness_tests import collect_probe

REPO_ROOT = Path(__file__).resolve().parents[1]
PYTEST_SCRIPT = Path(sys.executable).with_name("pytest")
TIMEOUT_S = 240
# Exit statuses that mean pytest itself broke: an internal error, or a crash (negative: a signal).
BROKEN = (3,)


@dataclass
class PytestRun:
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
    fresh: bool = False,
) -> PytestRun:
    """Run pytest with `args` in `cwd`; see the module docstring."""
    env = dict(env or clean_env())
    with tempfile.TemporaryDirectory(prefix="ckptspec-probe-") as out:
        if probe:
            env[collect_probe.ENV_VAR] = out
            args = [*args, "-p", collect_probe.__name__]
        if script or fresh:
            command = [str(PYTEST_SCRIPT)] if script else [sys.executable, "-m", "pytest"]
            done = subprocess.run(
                [*command, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
            )
            code, output = done.returncode, done.stdout + done.stderr
        else:
            code, output = _forked_pytest(args, Path(cwd), env, timeout, Path(out) / "output.log")
        collected = {path.stem: path.read_text().splitlines() for path in Path(out).glob("*.txt")}
    return PytestRun(args, code, output, collected)


SERVER_PRELOAD = ["torch", "torch.distributed", "pytest", "hypothesis", "ckptspec.spec.harness.plugin"]


def _forked_pytest(args: list[str], cwd: Path, env: dict[str, str], timeout: float, log: Path) -> tuple[int, str]:
    """pytest.main(args) in a process forked from the forkserver (see the module docstring): (exit status, output).

    The process leads its own process group, killed whole at the timeout (subprocess.TimeoutExpired).
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(SERVER_PRELOAD)  # no effect once the server runs (then it already has torch)
    process = ctx.Process(target=_pytest_main, args=(args, str(cwd), env, str(log)), name="ckptspec-pytest-run")
    process.start()
    process.join(timeout)
    if process.exitcode is None and process.pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.join()
        raise subprocess.TimeoutExpired(["pytest", *args], timeout)
    output = log.read_text() if log.exists() else ""
    return int(process.exitcode or 0), output


def _pytest_main(args: list[str], cwd: str, env: dict[str, str], log: str) -> None:
    """(in the forked process) Become `python -m pytest ARGS` in `cwd` with `env`, its output to `log`; exit."""
    code = 1
    try:
        os.setpgid(0, 0)
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        sys.stdout = open(1, "w", closefd=False, buffering=1)  # noqa: SIM115  (the process's own stdout)
        sys.stderr = open(2, "w", closefd=False, buffering=1)  # noqa: SIM115
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(env)
        # As `python -m` does: the working directory first, then $PYTHONPATH.
        sys.path[:0] = [cwd, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p)]
        for name in [n for n in sys.modules if n == "conftest" or n.startswith("conftest.")]:
            del sys.modules[name]  # a project's own conftest.py is imported under this name
        import pytest

        code = int(pytest.main(args))
    except BaseException:
        traceback.print_exc()
    finally:
        # What the interpreter's exit does for `python -m pytest`: the exit handlers (multiprocessing's stops the
        # run's own forkserver and removes its /tmp/pymp-* directory), then the flush; os._exit skips the rest of
        # the forked server's state.
        with contextlib.suppress(Exception):
            atexit._run_exitfuncs()
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
