"""The paired cost gate: the baseline's saver and the current one measured in the same job, interleaved.

    compare --against REF   REF: a commit of --repo (default: this checkout), or the path of a Python interpreter
                            in whose environment the baseline release is installed

Each side is a process of its own (ckptspec/bench/side.py, run by path; ckptspec/bench/sides.py) that owns one saver and saves
the same state dict when told; the driver alternates the sides pair by pair (A B, B A, ...: `paired.abba_order`),
so that a runner that changes speed during the job weighs on both alike, as asv and pyperf arrange it. A commit
is unpacked (`git archive`) into a temporary directory put first on the side's PYTHONPATH; an interpreter is run
as it is. The first save of each side (worker start, pools) is reported on its own, not gated.

Timed figures: `stall` (start() until staged() returned) and `committed` (start() until wait() returned), each the
median of the paired ratios current / baseline with its bootstrap 90% interval; a figure regresses when the whole
interval lies above the threshold (default DEFAULT_THRESHOLD). Counted figures (`sides.count_saves`), the same on every
run of the same code: per steady save, the fsync-family, rename, mkdir, unlink and write system calls of the side's
whole process tree (strace -f, its trace split at the side's marks, the first save left out), and the
files and bytes the checkpoint holds; any increase regresses. A side whose checkpoint does not hold the snapshot it
was given fails the comparison whatever its speed.
"""

from __future__ import annotations

import os
import shutil
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ckptspec.bench.figures import md_table
from ckptspec.bench.paired import Paired, abba_order, compare_paired
from ckptspec.bench.sides import Side, SideSpec, machine, started

__all__ = ["DEFAULT_THRESHOLD", "TIMED", "PairedResult", "PairedRow", "measure", "render", "rows", "verdict"]

DEFAULT_THRESHOLD = 1.1
TIMED = ("stall", "committed")


@dataclass
class PairedResult:
    """What one paired comparison measured (stored as JSON by `--json-out`)."""

    baseline: dict
    current: dict
    settings: dict
    first: dict[str, dict[str, float]] = field(default_factory=dict)
    rounds: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    paired: dict[str, Paired] = field(default_factory=dict)
    snapshot: dict[str, bool] = field(default_factory=dict)
    counted: dict[str, dict[str, float]] = field(default_factory=dict)
    counted_note: str | None = None
    load: dict[str, list[float]] = field(default_factory=dict)
    machine: dict = field(default_factory=dict)
    threshold: float | None = None
    passed: bool | None = None

    def as_dict(self) -> dict:
        out = asdict(self)
        out["paired"] = {k: v.as_dict() for k, v in self.paired.items()}
        return out


def _save(side: Side, directory: Path, verify: bool) -> dict:
    path = directory / f"{side.spec.label}-save"
    answer = side.request({"op": "save", "path": str(path), "verify": verify})
    shutil.rmtree(path, ignore_errors=True)
    return answer


def measure(
    baseline: SideSpec,
    current: SideSpec,
    pairs: int,
    size_mib: float,
    tensors: int,
    scratch: Path,
    device: str = "cpu",
) -> PairedResult:
    """Both sides started, one first save each, then `pairs` interleaved pairs; the first and last saves of each
    side are read back (outside the timed rounds). `device`: where both sides' tensors live (side.py)."""
    result = PairedResult(
        baseline={"impl": baseline.impl, "python": baseline.python, "pythonpath": list(baseline.pythonpath)},
        current={"impl": current.impl, "python": current.python},
        settings={"pairs": pairs, "size_mib": size_mib, "tensors": tensors, "device": device},
        machine=machine(),
    )
    for record, spec in ((result.baseline, baseline), (result.current, current)):
        record["env"] = {k: v for k, v in spec.environ().items() if k.startswith("CKPTSPEC_") and k != "CKPTSPEC_IMPL"}
    load_start = os.getloadavg()
    with started([baseline, current], scratch, size_mib, tensors, device=device) as (a, b):
        result.baseline["ready"], result.current["ready"] = a.ready, b.ready
        sides = {"A": a, "B": b}
        for key, side in sides.items():
            first = _save(side, scratch, verify=True)
            result.snapshot[key] = bool(first.pop("snapshot"))
            result.first[key] = first
        rounds: dict[str, dict[str, list[float]]] = {key: {f: [] for f in TIMED} for key in sides}
        order = abba_order(pairs)
        for i, pair in enumerate(order):
            for key in pair:
                answer = _save(sides[key], scratch, verify=i == len(order) - 1)
                if "snapshot" in answer:
                    result.snapshot[key] = result.snapshot[key] and bool(answer.pop("snapshot"))
                for f in TIMED:
                    rounds[key][f].append(answer[f])
    result.rounds = rounds
    result.paired = {f: compare_paired(rounds["A"][f], rounds["B"][f]) for f in TIMED}
    result.load = {"start": list(load_start), "end": list(os.getloadavg())}
    return result


@dataclass(frozen=True)
class PairedRow:
    """One line of the paired comparison's table."""

    figure: str
    baseline: str
    current: str
    ratio: str
    status: str  # ok, REGRESSED, faster, WRONG, reference


def rows(result: PairedResult, threshold: float) -> list[PairedRow]:
    """The table: snapshot checks, the timed figures, the first saves, then the counted costs."""
    out = []
    for key, label in (("A", "baseline"), ("B", "current")):
        if not result.snapshot.get(key, False):
            out.append(PairedRow(f"snapshot ({label})", "-", "-", "-", "WRONG"))
    for f in TIMED:
        p = result.paired[f]
        a, b = result.rounds["A"][f], result.rounds["B"][f]
        status = "REGRESSED" if p.above(threshold) else ("faster" if p.below(1 / threshold) else "ok")
        out.append(PairedRow(f, _ms(statistics.median(a)), _ms(statistics.median(b)), p.text(), status))
    for f in TIMED:
        a1, b1 = result.first["A"][f], result.first["B"][f]
        out.append(PairedRow(f"first save: {f}", _ms(a1), _ms(b1), f"{b1 / a1:.3f}x", "reference"))
    if result.counted:
        base, cur = result.counted["A"], result.counted["B"]
        for name in sorted(set(base) | set(cur)):
            x, y = base.get(name, 0), cur.get(name, 0)
            out.append(PairedRow(f"counted: {name}", f"{x:g}", f"{y:g}", f"{y - x:+g}", "REGRESSED" if y > x else "ok"))
    return out


def verdict(result: PairedResult, threshold: float) -> tuple[bool, str]:
    """(passed, one line)."""
    failed = [r for r in rows(result, threshold) if r.status in ("REGRESSED", "WRONG")]
    if failed:
        return False, "FAIL: " + "; ".join(f"{r.figure} {r.ratio} ({r.status})" for r in failed)
    timed = ", ".join(f"{f} {result.paired[f].text()}" for f in TIMED)
    return True, f"PASS: {timed}: no interval above {threshold:g}x, no counted cost grew"


def render(result: PairedResult, threshold: float) -> str:
    """The Markdown table, where the rounds ran, and the verdict line."""
    s = result.settings
    head = (
        f"Paired comparison: {s['pairs']} interleaved pairs, {s['size_mib']:g} MiB in {s['tensors']} tensors"
        f"{' on the GPU' if s.get('device') == 'cuda' else ''}; "
        f"baseline {result.baseline['impl']} ({_where(result.baseline)}), current {result.current['impl']}; "
        f"ratio = median of current / baseline over the pairs [bootstrap 90% interval]; "
        f"load average {result.load['start'][0]:.2f} -> {result.load['end'][0]:.2f}"
    )
    table = md_table(
        ["figure", "baseline", "current", "ratio", "verdict"],
        [[f"`{r.figure}`", r.baseline, r.current, r.ratio, r.status] for r in rows(result, threshold)],
    )
    notes = [f"note: {result.counted_note}"] if result.counted_note else []
    return "\n".join([head, "", *table, "", *notes, verdict(result, threshold)[1]]) + "\n"


def _where(side: dict) -> str:
    return side["pythonpath"][0] if side.get("pythonpath") else side["python"]


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3g} ms"
