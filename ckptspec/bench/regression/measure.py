"""One run of the regression set, and the figures it yields.

`run_set(settings, json_path)` runs the benchmarks marked `regression` once, with pytest-benchmark timing
them, into a pytest-benchmark JSON file. `figures_of(run)` reads that file's figures: each benchmark's fastest
round (`min`: a busy machine only ever adds time), and the reference it is divided by, measured in the same
run where the run holds one:

- a figure that has a `none` peer in the same run (the training loop without checkpointing) -> that peer;
- `stall` and `load` -> the memcpy ceiling; `durable` -> the write + fsync ceiling; `write` -> the ceiling
  its record names.

References (ceilings and `none` peers) are reported, never gated: they measure the machine, not the code.
`source_of(run)` says where a run came from (machine, Python, torch, commit).
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ckptspec.report import installed

__all__ = ["ROOT", "Figure", "Settings", "figures_of", "normalised", "run_set", "source_of"]

ROOT = Path(__file__).resolve().parents[3]
NO_REFERENCE_PEER = "none"
CEILING_OF = {"stall": "memcpy", "load": "memcpy", "durable": "write-fsync"}


@dataclass(frozen=True)
class Settings:
    """How the regression set runs; a baseline stores them and a comparison runs with the same."""

    size_mib: float = 8
    rounds: int = 7
    threads: int = 1
    pytest_args: list[str] = field(default_factory=list)

    def command(self, json_path: Path) -> list[str]:
        return [
            sys.executable,
            "-m",
            "pytest",
            *installed.pytest_options(),
            "ckptspec/bench",
            "-q",
            "-n",
            "0",
            "-p",
            "no:randomly",
            "-m",
            "regression",
            "--benchmark-enable",
            "--bench-size-mib",
            f"{self.size_mib:g}",
            "--bench-rounds",
            str(self.rounds),
            "--bench-threads",
            str(self.threads),
            "--benchmark-json",
            str(json_path),
            "--benchmark-columns=min,median,max,rounds",
            *self.pytest_args,
        ]

    def as_dict(self) -> dict:
        return asdict(self)


def run_set(settings: Settings, json_path: Path) -> int:
    """Run the regression set once from the repository root, its output on ours; pytest's exit status."""
    print("+ " + " ".join(settings.command(json_path)[1:]), flush=True)
    return subprocess.run(settings.command(json_path), cwd=ROOT, env=_child_env(), check=False).returncode


def _child_env() -> dict[str, str]:
    # When this runs inside a pytest worker (the tests), its xdist variables must not reach the child run.
    return {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}


@dataclass(frozen=True)
class Figure:
    """A benchmark's fastest round, and the benchmark of the same run it is divided by (None: absolute)."""

    figure: str
    peer: str
    seconds: float
    reference: str | None
    gated: bool

    def as_dict(self) -> dict:
        return asdict(self)


def figures_of(run: dict) -> dict[str, Figure]:
    """The figures of a pytest-benchmark JSON, by benchmark name."""
    benches = run.get("benchmarks", [])
    by_role = {(b.get("extra_info", {}).get("figure"), b.get("extra_info", {}).get("peer")): b["name"] for b in benches}
    found = {}
    for b in benches:
        extra = b.get("extra_info", {})
        kind, peer = extra.get("figure", "?"), extra.get("peer", "?")
        is_reference = kind == "ceiling" or peer == NO_REFERENCE_PEER
        reference = None
        if not is_reference:
            ceiling = extra.get("ceiling") or CEILING_OF.get(kind)
            reference = by_role.get((kind, NO_REFERENCE_PEER)) or by_role.get(("ceiling", ceiling))
        found[b["name"]] = Figure(kind, peer, float(b["stats"]["min"]), reference, not is_reference)
    return found


def normalised(name: str, figures: dict[str, Figure]) -> tuple[float, str]:
    """The figure `name` divided by its reference in the same set, and the unit ("x memcpy", or "s" when the
    set lacks the reference)."""
    fig = figures[name]
    ref = figures.get(fig.reference) if fig.reference else None
    if ref is None or ref.seconds <= 0:
        return fig.seconds, "s"
    return fig.seconds / ref.seconds, f"x {ref.peer}"


def source_of(run: dict) -> dict:
    """Machine, Python, torch and commit of a pytest-benchmark JSON."""
    machine = run.get("machine_info", {})
    ours = machine.get("ckptspec", {})
    commit = run.get("commit_info", {})
    cpu = machine.get("cpu", {}).get("brand_raw") or machine.get("processor") or "?"
    return {
        "machine": f"{machine.get('system', '?')} {machine.get('machine', '?')}, {cpu}, {ours.get('cores', '?')} cores",
        "node": machine.get("node"),
        "python": f"{machine.get('python_implementation', '?')} {machine.get('python_version', '?')}",
        "torch": ours.get("torch"),
        "commit": commit.get("id"),
        "dirty": commit.get("dirty"),
        "datetime": run.get("datetime"),
    }
