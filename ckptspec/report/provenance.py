"""Provenance: where a recorded run came from, written into its conformance JSON and shown with its verdicts.

A run written by `--conformance-json` (format FORMAT) carries `"provenance": [part]`, one part per run it was made
from (merge_runs concatenates its inputs' parts, so a merged run keeps each part's). A part holds the fields of
FIELDS: the project commit (`+dirty` when tracked files differed from it), the UTC date, the target and its version,
torch, Python, the machine (platform, CPU count, GPUs), the tensor device, the pytest command, and whether the
target's expectations were applied.

Runs stored before provenance was recorded get a reconstructed part (`python -m ckptspec.report.provenance
--reconstruct FILE ...`): what the file itself says (target, version, tensor device; torch for DCP, whose version is
torch's), the commits that stored the file (`git log --follow`), and "unknown" for everything else; its
`reconstructed` field says so. Nothing is guessed. Standard library only (read without torch).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckptspec.report.run_file import RunFile

__all__ = [
    "FIELDS",
    "FORMAT",
    "NO_EXPECTATIONS_VAR",
    "UNKNOWN",
    "current",
    "describe",
    "main",
    "of_session",
    "reconstruct",
]

FORMAT = 2  # 1: no "format" field, no provenance; 2: "format" and "provenance"
UNKNOWN = "unknown"
FIELDS = (
    "commit",
    "date",
    "target",
    "version",
    "torch",
    "python",
    "machine",
    "cpus",
    "gpu",
    "tensor_device",
    "command",
    "expectations",
)
# Set (to the reason) by `ckptspec judge` for a version with no recorded run: the target's expectations file is not
# applied, so that every failure is reported as it is (ckptspec.spec.harness.surface.loading reads it).
NO_EXPECTATIONS_VAR = "CKPTSPEC_NO_EXPECTATIONS"
_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str, cwd: Path = _ROOT) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def _commit() -> str:
    head = _git("rev-parse", "HEAD")
    if not head:
        return UNKNOWN  # installed from an archive, not a checkout
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return f"{head}+dirty" if dirty else head


def current(
    *, target: str, version: str, torch: str, gpu: str, tensor_device: str, command: str, expectations: str
) -> dict[str, Any]:
    """The provenance part of a run made now, in this process (the caller knows torch and the GPU)."""
    return {
        "commit": _commit(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "target": target,
        "version": version,
        "torch": torch,
        "python": platform.python_version(),
        "machine": platform.platform(),
        "cpus": os.cpu_count() or UNKNOWN,
        "gpu": gpu,
        "tensor_device": tensor_device,
        "command": command,
        "expectations": expectations,
    }


def of_session(
    target: str, version: str, tensor_device: str, args: Sequence[str], expectations: str | None
) -> dict[str, Any]:
    """The provenance part of the pytest session ending in this process (torch is imported by then)."""
    import torch  # here, not at the top: readers of runs do not need torch

    gpus = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    )
    skipped = os.environ.get(NO_EXPECTATIONS_VAR)
    return current(
        target=target,
        version=version,
        torch=str(torch.__version__),
        gpu=", ".join(gpus) or "none",
        tensor_device=tensor_device,
        command=shlex.join(["pytest", *args]),
        expectations=f"not applied: {skipped}" if skipped else "applied" if expectations else "none (no file)",
    )


def reconstruct(path: Path) -> dict[str, Any]:
    """The provenance part of a stored run written before provenance was: only what can be known."""
    data = RunFile.read(path)
    log = (
        _git("log", "--follow", "--diff-filter=AM", "--format=%H %cI", "--", path.name, cwd=path.resolve().parent) or ""
    )
    stored = [dict(zip(("commit", "date"), line.split(" ", 1), strict=True)) for line in log.splitlines()]
    outcomes = {test.outcome for test in data.tests}
    part: dict[str, Any] = dict.fromkeys(FIELDS, UNKNOWN)
    part |= {
        "target": data.target,
        "version": data.version,
        "tensor_device": data.tensor_device or UNKNOWN,
        "expectations": "applied" if outcomes & {"xfail", "xpass"} else UNKNOWN,
        "reconstructed": "recorded before runs carried provenance: the fields the file itself shows, the commits "
        "that stored it (newest first; each run was made before its commit; renames left out), and unknown for the rest",
        "stored_in": stored,
    }
    if data.target.startswith("dcp-"):
        part["torch"] = data.version  # DCP's version is the torch the run imported
    return part


def describe(part: Mapping[str, Any]) -> str:
    """One line of Markdown for a provenance part: what is known, then the fields not recorded."""
    shown = {
        "commit": f"commit {str(part.get('commit'))[:16]}",
        "date": f"{part.get('date')}",
        "torch": f"torch {part.get('torch')}",
        "python": f"Python {part.get('python')}",
        "machine": f"{part.get('machine')}",
        "cpus": f"{part.get('cpus')} CPUs",
        "gpu": f"GPU: {part.get('gpu')}",
        "tensor_device": f"{part.get('tensor_device')} tensors",
        "expectations": f"expectations {part.get('expectations')}",
        "command": f"command `{part.get('command')}`",
    }
    known = [text for field, text in shown.items() if part.get(field, UNKNOWN) != UNKNOWN]
    missing = [field for field in shown if part.get(field, UNKNOWN) == UNKNOWN]
    line = f"{part.get('target', UNKNOWN)} {part.get('version', UNKNOWN)}"
    stored = part.get("stored_in") or []
    if part.get("reconstructed"):
        where = f"last {stored[0]['commit'][:10]}, {stored[0]['date'][:10]}" if stored else "none found"
        line += f" (reconstructed from git; commits that stored it: {len(stored)}, {where})"
    line += ": " + ", ".join(known) if known else ""
    return line + (f"; not recorded: {', '.join(missing)}" if missing else "")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptspec.report.provenance", description=__doc__.splitlines()[0])
    parser.add_argument("--reconstruct", nargs="+", type=Path, required=True, metavar="JSON")
    args = parser.parse_args(argv)
    for path in args.reconstruct:
        data = RunFile.read(path)
        if data.provenance:
            print(f"{path}: has provenance; left as it is")
            continue
        part = reconstruct(path)
        data.format, data.provenance = FORMAT, [part]
        data.write(path)
        print(f"{path}: {describe(part)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
