"""Cost at scale: each peer's stall and time to committed as the state grows in size, in tensors or in ranks.

    python -m ckptspec.bench.sweep run --axis size --values 64,256,1024 --peer impl --peer dcp.save=sync_dcp_adapter \\
        [--size-mib 64] [--tensors 16] [--ranks 1] [--rounds 5] --out RUN.json
    python -m ckptspec.bench.sweep table RUN.json ... [--update docs/benchmarks.md --block sweep]
    python -m ckptspec.bench.sweep plot RUN.json --out FIGURE.png

`--peer [LABEL=]ADAPTER[@PYTHON][:NAME=VALUE,...]`: a protocol adapter measured in a side of its own
(ckptspec/bench/sides.py), run by PYTHON (default this one) with those variables, e.g.
`impl-overlapped=impl:CKPTSPEC_IMPL_STAGING=overlapped` or `dcp.save=sync_dcp_adapter:PYTHONPATH=docs/examples`.
At each point of the axis (`size`: MiB per rank; `tensors`: the same bytes in that many tensors; `ranks`: that many
gloo ranks, each with `--size-mib`) every peer's side is started, saves once (its first save, reported apart),
then `--rounds` rounds in which the peers take turns, the order rotated each round so that none always goes first;
the first and the last save of each are read back. A point's figure is the median over its rounds with a
bootstrap 90% interval of the median; each save also reports its phases (`PHASES`): until start() returned, until
the snapshot was taken (staged()), until the checkpoint's last data write, until its metadata file was written
(the files' modification times: data fsyncs, the gather and the metadata write fall here), and until wait()
returned (the commit and the finalize); with several ranks, rank 0's wait and the slowest other rank's.

`table` fits each peer's growth over the axis (time = fixed + per-unit x value, least squares over the points'
medians: per GiB, per 1,000 tensors, per rank) and names growth as super-linear where the last step's log-log slope
exceeds SUPERLINEAR (1.0 is proportional). Unless `--no-count`, each peer's counted costs per steady save at the
first point (one rank; `sides.count_saves`: system calls by group, files) go beside its growth. No torch: the tables
are regenerated from the stored runs.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from ckptspec.bench.figures import md_table
from ckptspec.bench.sides import GateError, SideSpec, count_saves, machine, scratch_dir, started
from ckptspec.report.blocks import markers, update_file
from ckptspec.report.runs import ReportError

__all__ = ["AXES", "PHASES", "SUPERLINEAR", "PeerSpec", "fit", "main", "parse_peer", "phases_of", "table"]

AXES = {"size": "MiB per rank", "tensors": "tensors", "ranks": "ranks"}
UNIT = {"size": (1024, "per GiB"), "tensors": (1000, "per 1,000 tensors"), "ranks": (1, "per rank")}
PHASES = ("start", "snapshot", "data written", "to metadata", "to committed")
SUPERLINEAR = 1.15
FORMAT = "ckptspec-sweep/1"


@dataclass(frozen=True)
class PeerSpec:
    label: str
    adapter: str
    python: str
    env: tuple[tuple[str, str], ...]

    def side(self) -> SideSpec:
        return SideSpec(self.label, self.python, self.adapter, env=self.env)


def parse_peer(text: str) -> PeerSpec:
    """`[LABEL=]ADAPTER[@PYTHON][:NAME=VALUE,...]` (see the module docstring); ValueError saying what is wrong."""
    head, _, env_text = text.partition(":")
    label, eq, rest = head.partition("=")
    if not eq:
        label, rest = "", head
    adapter, _, python = rest.partition("@")
    if not adapter:
        raise ValueError(f"--peer {text!r}: no adapter named")
    env = []
    for item in filter(None, env_text.split(",")):
        name, eq, value = item.partition("=")
        if not eq or not name:
            raise ValueError(f"--peer {text!r}: {item!r} is not NAME=VALUE")
        env.append((name, os.path.abspath(value) if name == "PYTHONPATH" else value))
    return PeerSpec(label or adapter, adapter, python or sys.executable, tuple(env))


def _point(axis: str, value: float, args: argparse.Namespace) -> dict:
    size, tensors, world = args.size_mib, args.tensors, args.ranks
    if axis == "size":
        size = value
    elif axis == "tensors":
        tensors = int(value)
    else:
        world = int(value)
    return {"value": value, "size_mib": size, "tensors": tensors, "world": world}


def measure_point(peers: list[PeerSpec], point: dict, rounds: int, scratch: Path) -> dict:
    """One point of the axis, every peer (see the module docstring)."""
    out: dict[str, dict] = {p.label: {"rounds": []} for p in peers}
    specs = [p.side() for p in peers]
    with started(specs, scratch, point["size_mib"], point["tensors"], point["world"]) as sides:
        for peer, side in zip(peers, sides, strict=True):
            out[peer.label]["first"] = _save(side, scratch, verify=True)
            out[peer.label]["version"] = side.ready.get("version")
        for r in range(rounds):
            turn = r % len(sides)
            for peer, side in [*zip(peers, sides, strict=True)][turn:] + [*zip(peers, sides, strict=True)][:turn]:
                out[peer.label]["rounds"].append(_save(side, scratch, verify=r == rounds - 1))
    for data in out.values():
        checks = [data["first"].get("snapshot"), data["rounds"][-1].get("snapshot")]
        data["snapshot"] = all(c is True for c in checks)
    return {**point, "peers": out}


def _save(side, scratch: Path, verify: bool) -> dict:
    path = scratch / f"{side.spec.label}-save"
    answer = side.request({"op": "save", "path": str(path), "verify": verify})
    shutil.rmtree(path, ignore_errors=True)
    return answer


def phases_of(save: dict) -> dict[str, float]:
    """A save's phases in seconds (PHASES), from its marks; a phase the files cannot place is 0."""
    start, stall, committed = save["start"], save["stall"], save["committed"]
    data = save.get("data_last")
    meta = save.get("metadata")
    data = min(max(data if data is not None else stall, stall), committed)
    meta = min(max(meta if meta is not None else data, data), committed)
    return {
        "start": start,
        "snapshot": stall - start,
        "data written": data - stall,
        "to metadata": meta - data,
        "to committed": committed - meta,
    }


def _median_interval(values: list[float], seed: int = 0) -> tuple[float, float, float]:
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(1000))
    return statistics.median(values), medians[50], medians[949]


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (fixed, slope) of ys over xs; slope 0 for a single point."""
    if len(xs) < 2:
        return (ys[0] if ys else 0.0), 0.0
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return my - slope * mx, slope


def _last_slope(xs: list[float], ys: list[float]) -> float | None:
    if len(xs) < 2 or min(ys[-2:]) <= 0 or xs[-1] == xs[-2]:
        return None
    return math.log(ys[-1] / ys[-2]) / math.log(xs[-1] / xs[-2])


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.0f}" if abs(ms) >= 100 else f"{ms:.3g}"


def table(run: dict) -> str:
    """Markdown: each point's figures per peer, then each peer's fitted growth (see the module docstring)."""
    axis = run["axis"]
    labels = list(run["peers"])
    rows = []
    growth: dict[str, dict[str, list[float]]] = {label: {"x": [], "stall": [], "committed": []} for label in labels}
    for point in run["points"]:
        for label in labels:
            data = point["peers"][label]
            stall = _median_interval([s["stall"] for s in data["rounds"]])
            committed = _median_interval([s["committed"] for s in data["rounds"]])
            phase = {k: statistics.median(phases_of(s)[k] for s in data["rounds"]) for k in PHASES}
            others = [max((r["committed"] for r in s["ranks"][1:]), default=None) for s in data["rounds"]]
            waits = [o for o in others if o is not None]
            rows.append(
                [
                    f"{point['value']:g}",
                    f"`{label}`",
                    f"{_ms(stall[0])} [{_ms(stall[1])}, {_ms(stall[2])}]",
                    f"{_ms(committed[0])} [{_ms(committed[1])}, {_ms(committed[2])}]",
                    _ms(data["first"]["committed"]),
                    " / ".join(_ms(phase[k]) for k in PHASES),
                    _ms(statistics.median(waits)) if waits else "-",
                    "yes" if data["snapshot"] else "**NO**",
                ]
            )
            growth[label]["x"].append(float(point["value"]))
            growth[label]["stall"].append(stall[0])
            growth[label]["committed"].append(committed[0])
    per, unit = UNIT[axis]
    fits = []
    for label in labels:
        g = growth[label]
        cells = []
        for figure in ("stall", "committed"):
            fixed, slope = fit(g["x"], g[figure])
            last = _last_slope(g["x"], g[figure])
            shape = "-" if last is None else f"{last:.2f}" + (" **super-linear**" if last > SUPERLINEAR else "")
            cells += [f"{_ms(slope * per)} ms {unit} (+{_ms(max(fixed, 0.0))} ms)", shape]
        counted = run.get("counted", {}).get(label)
        keys = ("fsync", "rename", "mkdir", "unlink", "write", "files")
        cells.append(", ".join(f"{k} {counted[k]:g}" for k in keys if k in counted) if counted else "-")
        fits.append([f"`{label}`", *cells])
    counted_head = f"counted per save at {run['counted_at']:g}" if "counted_at" in run else "counted per save"
    s = run["settings"]
    fixed_axes = ", ".join(f"{AXES[k]} {s[k]:g}" for k in ("size", "tensors", "ranks") if k != axis)
    m = run["machine"]
    head = (
        f"Sweep over {AXES[axis]} ({fixed_axes}; {s['rounds']} rounds per point, peers taking turns), "
        f"{m.get('datetime', '?')[:10]}, {m.get('cores', '?')} cores, {m.get('memory_gib', '?')} GiB, "
        f"load average {run['load']['start'][0]:.1f} -> {run['load']['end'][0]:.1f}. Times in ms: median [90% "
        f"interval]; phases: {' / '.join(PHASES)}."
    )
    return (
        "\n".join(
            [
                head,
                "",
                *md_table(
                    [
                        AXES[axis],
                        "peer",
                        "stall",
                        "time to committed",
                        "first save",
                        "phases",
                        "other ranks' wait",
                        "snapshots correct",
                    ],
                    rows,
                ),
                "",
                *md_table(
                    [
                        "peer",
                        "stall growth",
                        "last step's log-log slope",
                        "committed growth",
                        "last step's slope",
                        counted_head,
                    ],
                    fits,
                ),
            ]
        )
        + "\n"
    )


def plot(run: dict, out: Path) -> None:
    """Time to committed against the axis per peer (log-log), and the phases of the largest point stacked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = list(run["peers"])
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label in labels:
        xs = [p["value"] for p in run["points"]]
        ys = [statistics.median(s["committed"] for s in p["peers"][label]["rounds"]) for p in run["points"]]
        stalls = [statistics.median(s["stall"] for s in p["peers"][label]["rounds"]) for p in run["points"]]
        left.plot(xs, ys, marker="o", label=f"{label}: committed")
        left.plot(xs, stalls, marker="x", linestyle="--", label=f"{label}: stall")
    left.set_xscale("log")
    left.set_yscale("log")
    ticks = [p["value"] for p in run["points"]]
    left.set_xticks(ticks, [f"{t:g}" for t in ticks])
    left.minorticks_off()
    left.set_xlabel(AXES[run["axis"]])
    left.set_ylabel("seconds (median)")
    left.legend(fontsize=7)
    last = run["points"][-1]
    bottoms = [0.0] * len(labels)
    for phase in PHASES:
        heights = [statistics.median(phases_of(s)[phase] for s in last["peers"][lb]["rounds"]) for lb in labels]
        right.barh(labels, heights, left=bottoms, label=phase)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    right.set_xlabel(f"seconds, at {last['value']:g} {AXES[run['axis']]}")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


def run_sweep(args: argparse.Namespace) -> int:
    try:
        peers = [parse_peer(p) for p in args.peer]
        values = [float(v) for v in args.values.split(",")]
    except ValueError as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        return 2
    if len({p.label for p in peers}) != len(peers):
        print("sweep: two peers share a label (give LABEL=ADAPTER)", file=sys.stderr)
        return 2
    load = os.getloadavg()
    run = {
        "format": FORMAT,
        "axis": args.axis,
        "machine": machine(),
        "settings": {"size": args.size_mib, "tensors": args.tensors, "ranks": args.ranks, "rounds": args.rounds},
        "peers": {p.label: {"adapter": p.adapter, "python": p.python, "env": dict(p.env)} for p in peers},
        "points": [],
    }
    with scratch_dir() as tmp:
        for value in values:
            point = _point(args.axis, value, args)
            print(f"sweep: {args.axis} {value:g}", flush=True)
            run["points"].append(measure_point(peers, point, args.rounds, tmp / f"p{value:g}"))
        if not args.no_count:
            first = run["points"][0]
            run["counted_at"] = first["value"]
            try:
                run["counted"] = {
                    p.label: count_saves(p.side(), first["size_mib"], first["tensors"], tmp / f"count-{p.label}")
                    for p in peers
                }
            except GateError as exc:
                run["counted_note"] = str(exc)
    run["load"] = {"start": list(load), "end": list(os.getloadavg())}
    args.out.write_text(json.dumps(run, indent=1) + "\n")
    print(table(run), end="")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m ckptspec.bench.sweep", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="measure every peer at every point of one axis")
    r.add_argument("--axis", choices=list(AXES), required=True)
    r.add_argument("--values", required=True, help="the axis' points, comma-separated")
    r.add_argument("--peer", action="append", required=True)
    r.add_argument("--size-mib", type=float, default=64)
    r.add_argument("--tensors", type=int, default=16)
    r.add_argument("--ranks", type=int, default=1)
    r.add_argument("--rounds", type=int, default=5)
    r.add_argument("--no-count", action="store_true", help="skip the counted costs (strace, one rank)")
    r.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("table", help="the tables of stored sweeps (no torch)")
    t.add_argument("runs", nargs="*", type=Path)
    t.add_argument("--update", type=Path)
    t.add_argument("--block", default="sweep")
    p = sub.add_parser("plot", help="the figure of one stored sweep (matplotlib)")
    p.add_argument("run", type=Path)
    p.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.command == "run":
        return run_sweep(args)
    if args.command == "plot":
        plot(json.loads(args.run.read_text()), args.out)
        return 0
    text = "\n".join(table(json.loads(path.read_text())) for path in args.runs)
    if args.update is None:
        print(text, end="")
        return 0
    try:
        update_file(args.update, text, *markers(f"benchmarks-{args.block}"))
    except ReportError as exc:
        raise SystemExit(str(exc)) from None
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
