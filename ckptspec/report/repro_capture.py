"""Captured reproducer outputs: each reproducer of a release run once, on the release and on impl, and recorded.

    python -m ckptspec.report.repro_capture --release nvrx-0.7.0 --python /work/main/.nox/spec-nvrx-0-7-0/bin/python
        [--impl-python PYTHON] [--no-impl] [--clauses AQ-7 AR-8 ...] [--bound 600]

For each clause whose maintainer report exists (ckptspec.report.findings.reportable: a documented or implied
data-loss or hang break of the stored run `conformance/all/<release>.json` with a reproducer), or each of
`--clauses`, runs `findings/repro/<release>/<CLAUSE>.py` from the repository root, as a user types it: with the
release's package (`--python`: an environment where that release is installed) and, where the script takes `impl`
(its docstring's usage line lists it), with `impl` (`--impl-python`, by default this Python; `--no-impl`: not). Each run gets at most
`--bound` seconds; its whole process group is then killed. Run it under the heavy lock: a reproducer starts ranks.

Each run is written to `findings/repro/<release>/<CLAUSE>.out` (the release) or `<CLAUSE>.impl.out` (impl), as
committed data the reports (ckptspec.report.repro_reports) quote:

    $ python findings/repro/<release>/<CLAUSE>.py PACKAGE
    exit status: 1                      (or "none: killed after the N s bound")
    duration: under 30 s                (a coarse bucket, so that a rerun does not change the file)
    --- stdout (last lines) ---
    ...
    --- stderr (last lines) ---
    ...

The output is normalised so that reruns on another machine give the same text: the repository root, Python's
installation and site-packages, temporary directories, process ids, ports, addresses and timestamps become
placeholders, and warnings (Python's, with their source line, and glog's `W` lines: import-time noise of the
libraries) are left out. `read(path)` parses a file back into a Captured.
"""

from __future__ import annotations

import argparse
import ast
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from ckptspec.report import clauses as clause_registry
from ckptspec.report.findings import REPRO_DIR, reportable
from ckptspec.report.report import clause_verdict
from ckptspec.report.runs import RELEASE_LABEL, REPO_ROOT, ReportError, load_run

__all__ = [
    "PACKAGES",
    "Captured",
    "capture",
    "main",
    "normalise",
    "out_path",
    "package_arguments",
    "read",
    "render",
]

# Target -> the PACKAGE argument its reproducers take for the release (each script's usage line lists its choices).
PACKAGES = {
    "nvrx": "nvidia_resiliency_ext",
    "mcore": "megatron.core",
    "lightning": "pytorch_lightning",
    "torchtitan": "torchtitan",
    "deepspeed": "deepspeed",
    "deepspeed-decoupled": "deepspeed",
    "olmo-core": "olmo_core",
    "transformers": "transformers",
    "torch-checkpointing": "torch_checkpointing",
    "torch-checkpointing-buffered": "torch_checkpointing",
}
IMPL = "impl"
TAIL_LINES = 15
LINE_WIDTH = 300
DURATIONS_S = (10, 30, 60, 120, 300, 600)
# Machine-specific text -> its placeholder, in this order (site-packages before the standard library's path).
_NORMALISE = [
    (re.compile(r"(?:/[^\s\"'/:]+)+/site-packages/"), "<site-packages>/"),
    (re.compile(r"(?:/[^\s\"'/:]+)*/lib/python3\.\d+/"), "<python>/"),
    (re.compile(r"(?:/[^\s\"'/:]+)+/(?=(?:impl|findings|ckptspec/spec)/)"), ""),
    (re.compile(r"/(?:tmp|var/tmp)/[^\s\"'/:]+"), "<tmp>"),
    (re.compile(r"\b(pid|PID|process|Process)([ =:]+)\d+"), r"\1\2<pid>"),
    (re.compile(r"\b(127\.0\.0\.1|localhost|0\.0\.0\.0):\d+"), r"\1:<port>"),
    (re.compile(r"\b0x[0-9a-fA-F]{6,}\b"), "0x<addr>"),
    (re.compile(r"\d{4}-\d{2}-\d{2}[ T]\d{2}:\d{2}:\d{2}(?:[.,]\d+)?"), "<time>"),
    # glog's prefix, after torch's rank tag where it adds one: "[rank0]:W1127 04:39:09.099000 16477 "
    (re.compile(r"^((?:\[rank\d+\]:)?[IWEF])\d{4} \d{2}:\d{2}:\d{2}\.\d+\s+\d+ ", re.M), r"\1<time> <pid> "),
]
# A warning line: Python's (`path:line: SomeWarning: text`) or glog's (`W<time> <pid> path:line] text`).
_WARNING = re.compile(r"^(?:\S+:\d+: [A-Za-z]*Warning: |(?:\[rank\d+\]:)?W<time> <pid> )")
_HEADER = re.compile(r"^\$ (?P<command>.*)\nexit status: (?P<status>.*)\nduration: (?P<duration>.*)\n", re.M)
_USAGE = re.compile(r"^\s*python \S+\.py (?P<choices>.+)$", re.M)


@dataclass(frozen=True)
class Captured:
    """One recorded run of a reproducer."""

    command: str  # as a user types it from the repository root
    status: str  # the exit status ("1"), or why there is none
    duration: str  # a bucket: "under 30 s"
    stdout: list[str]  # its last lines, normalised
    stderr: list[str]

    @property
    def exit_code(self) -> int | None:
        return int(self.status) if self.status.lstrip("-").isdigit() else None


def out_path(release: str, clause: str, package: str) -> Path:
    """Where the run of `release`'s reproducer of `clause` with `package` is recorded (relative to the root)."""
    return Path(REPRO_DIR) / release / (f"{clause}.impl.out" if package == IMPL else f"{clause}.out")


def package_arguments(script: Path) -> list[str]:
    """The PACKAGE choices the docstring's usage line (`python X.py a | b | impl`) gives."""
    doc = ast.get_docstring(ast.parse(script.read_text())) or ""
    found = _USAGE.search(doc)
    if not found:
        raise ReportError(f"{script}: no usage line (`python {script.name} PACKAGE`) in its docstring")
    return [choice.strip() for choice in found["choices"].split("|")]


def normalise(text: str, root: Path = REPO_ROOT) -> str:
    """`text` with the machine-specific parts replaced (see the module's docstring). The installation's paths go
    first: a virtual environment inside the repository is still the installation, not a file of the repository."""
    for pattern, placeholder in _NORMALISE[:2]:
        text = pattern.sub(placeholder, text)
    text = text.replace(f"{root}/", "")
    for pattern, placeholder in _NORMALISE[2:]:
        text = pattern.sub(placeholder, text)
    return text.replace(str(Path.home()), "~")


def _tail(text: str) -> list[str]:
    kept: list[str] = []
    skip_source_line = False
    for line in normalise(text).splitlines():
        if skip_source_line and line.startswith(" "):  # the source line a Python warning shows below itself
            skip_source_line = False
            continue
        skip_source_line = bool(_WARNING.match(line))
        if line.strip() and not skip_source_line:
            kept.append(line.rstrip()[:LINE_WIDTH])
    return kept[-TAIL_LINES:]


def _bucket(seconds: float) -> str:
    limit = next((b for b in DURATIONS_S if seconds < b), None)
    return f"under {limit} s" if limit else f"{DURATIONS_S[-1]} s or more"


def render(captured: Captured) -> str:
    """The text of a .out file (ends with a newline)."""
    lines = [f"$ {captured.command}", f"exit status: {captured.status}", f"duration: {captured.duration}"]
    lines += ["--- stdout (last lines) ---", *captured.stdout, "--- stderr (last lines) ---", *captured.stderr]
    return "\n".join(lines) + "\n"


def read(path: Path) -> Captured:
    """Parse a .out file written by render()."""
    text = path.read_text()
    head = _HEADER.match(text)
    if not head or "--- stdout (last lines) ---\n" not in text or "--- stderr (last lines) ---" not in text:
        raise ReportError(f"{path}: not a captured reproducer output (python -m {__spec__.name})")
    body = text[head.end() :].removeprefix("--- stdout (last lines) ---\n")
    out, err = body.split("--- stderr (last lines) ---", 1)
    return Captured(head["command"], head["status"], head["duration"], out.splitlines(), err.splitlines()[1:])


def capture(python: str, script: Path, package: str, bound_s: float, root: Path = REPO_ROOT) -> Captured:
    """Run `script PACKAGE` with `python` in `root`, its process group killed after `bound_s`; its Captured."""
    relative = script.relative_to(root)
    start = time.monotonic()
    proc = subprocess.Popen(
        [python, str(relative), package],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own group: what it leaves behind is killed with it
    )
    try:
        out, err = proc.communicate(timeout=bound_s)
        status = str(proc.returncode)
    except subprocess.TimeoutExpired:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        status = f"none: killed after the {bound_s:g} s bound"
    with suppress(ProcessLookupError):  # ranks it left in its group
        os.killpg(proc.pid, signal.SIGKILL)
    command = f"python {relative} {package}"
    return Captured(command, status, _bucket(time.monotonic() - start), _tail(out), _tail(err))


def _clauses(release: str) -> list[str]:
    """The clauses of `release`'s stored run that get a maintainer report."""
    run = load_run(REPO_ROOT / "conformance" / "all" / f"{release}.json")
    registry = clause_registry.load()
    known = {**run.clauses, **registry}
    return [cid for cid in registry if reportable(run, cid, known[cid], clause_verdict(run, cid, known))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("--release", required=True, help="TARGET-RELEASE, e.g. nvrx-0.7.0")
    parser.add_argument("--python", required=True, help="a Python where that release is installed")
    parser.add_argument("--impl-python", default=sys.executable, help="a Python where impl is importable")
    parser.add_argument("--clauses", nargs="+", metavar="ID", help="only these (default: every reported break)")
    parser.add_argument("--no-impl", action="store_true", help="run on the release only (keep the impl captures)")
    parser.add_argument("--bound", type=float, default=600.0, metavar="S", help="seconds per run (default 600)")
    args = parser.parse_args(argv)
    label = RELEASE_LABEL.match(args.release)
    if not label or label["target"] not in PACKAGES:
        parser.error(f"--release: TARGET-RELEASE with TARGET one of {', '.join(PACKAGES)}")
    try:
        clauses = args.clauses or _clauses(args.release)
        for cid in clauses:
            script = REPO_ROOT / REPRO_DIR / args.release / f"{cid}.py"
            if not script.exists():
                raise ReportError(f"{script.relative_to(REPO_ROOT)}: no such reproducer")
            choices = package_arguments(script)
            runs = [(args.python, PACKAGES[label["target"]])] + (
                [(args.impl_python, IMPL)] if IMPL in choices and not args.no_impl else []
            )
            for python, package in runs:
                if package not in choices:
                    raise ReportError(f"{script.name} does not take {package} (its usage: {' | '.join(choices)})")
                captured = capture(python, script, package, args.bound)
                (REPO_ROOT / out_path(args.release, cid, package)).write_text(render(captured))
                print(f"{captured.command}: exit status {captured.status} ({captured.duration})", flush=True)
    except ReportError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
