"""Cost at scale: each peer's stall and time to committed as the state grows in size, in tensors or in ranks.

    python -m ckptspec.bench.sweep run --axis size --values 64,256,1024 --peer impl --peer dcp.save=sync_dcp_adapter \\
        [--size-mib 64] [--tensors 16] [--ranks 1] [--rounds 5] [--device cpu] --out RUN.json
    python -m ckptspec.bench.sweep run ... --device cuda --budget-s 300 --fit-memory --rounds 20 --table-out RUN.md
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

`--device cuda` puts every side's tensors on the GPU (rank r on cuda:r; ckptspec/bench/side.py); without a GPU it
stops at once, saying so. `--fit-memory` leaves out, before anything runs, the points this machine cannot hold
(`fit_point`: host memory, GPU memory, disk, GPUs for the ranks), each named with why, and starts the peers of a
point in groups small enough to fit (the peers of one group take turns; the groups run one after another).
`--budget-s S` sizes the rounds from a first measurement (`size_rounds`): the first save of every peer at the
smallest and the largest point, timed with the sides' start, gives each point's fixed cost and a (pessimistic)
round, interpolated in between; the rounds are what fits S, at least `--min-rounds`, at most `--rounds`. The
points run smallest first, and a point stops taking rounds when the next would pass S, so what the budget cuts is
the largest points' last rounds; the run's JSON is rewritten after every point and on SIGINT, so that it always
holds every point measured so far, each figure with its interval. A peer whose side cannot start (its release is
not on the path) is reported as skipped with the reason, and one that fails at a point is dropped from the later
points with its error; the others go on. `--plan-only` prints and stores what would run (the points, the groups,
each peer's adapter loaded or why not) and measures nothing.

`table` fits each peer's growth over the axis (time = fixed + per-unit x value, least squares over the points'
medians: per GiB, per 1,000 tensors, per rank) and names growth as super-linear where the last step's log-log slope
exceeds SUPERLINEAR (1.0 is proportional). Unless `--no-count`, each peer's counted costs per steady save at the
first point (one rank; `sides.count_saves`: system calls by group, files) go beside its growth. No torch: the tables
are regenerated from the stored runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from ckptspec.bench.figures import md_table
from ckptspec.bench.sides import (
    DEVICES,
    GateError,
    Side,
    SideSpec,
    count_saves,
    device_problem,
    machine,
    scratch_dir,
)
from ckptspec.report.blocks import markers, update_file
from ckptspec.report.runs import ReportError

__all__ = [
    "AXES",
    "PHASES",
    "SUPERLINEAR",
    "PeerSpec",
    "Resources",
    "fit",
    "fit_point",
    "interpolate",
    "main",
    "parse_peer",
    "parser",
    "phases_of",
    "size_rounds",
    "table",
]

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
        """Its side; a PYTHONPATH it names goes before the driver's (which holds the checkout and the releases)."""
        path = tuple(value for name, value in self.env if name == "PYTHONPATH")
        env = tuple((name, value) for name, value in self.env if name != "PYTHONPATH")
        return SideSpec(self.label, self.python, self.adapter, path, env)


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


def measure_point(
    peers: list[PeerSpec],
    point: dict,
    rounds: int,
    scratch: Path,
    device: str = "cpu",
    group: int | None = None,
    deadline: float | None = None,
) -> dict:
    """One point of the axis, every peer (see the module docstring): the peers started `group` at a time (all at
    once by default); before each round, the round is skipped when it would end after `deadline` (time.monotonic()),
    and the point says it was cut. A peer that fails keeps what it measured, with its `error`."""
    out: dict[str, dict] = {p.label: {"rounds": []} for p in peers}
    size = group or len(peers)
    chunks = [peers[i : i + size] for i in range(0, len(peers), size)]
    cut = False
    for chunk in chunks:
        running: list[tuple[PeerSpec, Side]] = []
        pending: list[tuple[PeerSpec, Side]] = []
        if deadline is not None and time.monotonic() > deadline:  # a later group the budget leaves no time
            cut = True
            continue
        try:
            pending = []
            for peer in chunk:  # started at once, then awaited: a GPU node spends seconds importing torch in each
                spec = peer.side()
                where = scratch / peer.label
                try:
                    side = Side(
                        spec,
                        where,
                        point["size_mib"],
                        point["tensors"],
                        world=point["world"],
                        device=device,
                        wait=False,
                        phases=True,
                    )
                except OSError as exc:
                    out[peer.label]["error"] = f"start: {exc}"
                    continue
                pending.append((peer, side))
            for peer, side in pending:
                try:
                    side.await_ready()
                except GateError as exc:
                    out[peer.label]["error"] = f"start: {exc}"
                    continue
                running.append((peer, side))
                out[peer.label]["version"] = side.ready.get("version")
            for peer, side in list(running):
                try:
                    out[peer.label]["first"] = _save(side, scratch, verify=True)
                except GateError as exc:
                    out[peer.label]["error"] = f"first save: {exc}"
                    running.remove((peer, side))
                    side.close()
            spent: list[float] = []
            for r in range(rounds):
                longest = max(spent, default=0.0)
                if deadline is not None and time.monotonic() + longest > deadline:
                    cut = True
                    break
                began = time.monotonic()
                turn = r % max(len(running), 1)
                for peer, side in running[turn:] + running[:turn]:
                    try:
                        out[peer.label]["rounds"].append(_save(side, scratch, verify=r == rounds - 1))
                    except GateError as exc:
                        out[peer.label]["error"] = f"round {r + 1}: {exc}"
                        running.remove((peer, side))
                        side.close()
                spent.append(time.monotonic() - began)
        finally:  # at once (a saver's close waits for its workers); a side already closed is left as it is
            with ThreadPoolExecutor(max_workers=max(len(pending), 1)) as closing:
                list(closing.map(lambda entry: entry[1].close(), pending))
    for data in out.values():
        checks = [data.get("first", {}).get("snapshot"), *(s.get("snapshot") for s in data["rounds"][-1:])]
        data["snapshot"] = all(c is True for c in checks) if data["rounds"] else bool(checks[0])
    extra = {"groups": [[p.label for p in c] for c in chunks]} if len(chunks) > 1 else {}
    return {**point, **extra, **({"cut": True} if cut else {}), "peers": out}


def _save(side, scratch: Path, verify: bool) -> dict:
    path = scratch / f"{side.spec.label}-save"
    began = time.monotonic()
    answer = side.request({"op": "save", "path": str(path), "verify": verify})
    shutil.rmtree(path, ignore_errors=True)
    return {**answer, "wall": time.monotonic() - began}


@dataclass(frozen=True)
class Resources:
    """What this machine has for a point, in bytes (gpu_free: per GPU; gpus: 0 without CUDA)."""

    host_available: int
    disk_free: int
    gpus: int = 0
    gpu_free: int = 0


# Bytes a side needs per byte of its state dict, by device: on the GPU the state and one device clone (impl's
# snapshot) on the GPU, a staging copy and a worker's copy on the host; on the CPU the state as well. A margin is
# kept off each resource (FIT_MARGIN), and a save's files are on disk once at a time (removed after each save).
GPU_FACTOR = 2.0
HOST_FACTOR = {"cuda": 2.0, "cpu": 3.0}
FIT_MARGIN = 0.8


def fit_point(point: dict, peers: int, device: str, have: Resources) -> tuple[int, str | None]:
    """(how many peers' sides fit at once at `point`, None) or (0, why the point does not fit here)."""
    gib = 1 << 30
    state = point["size_mib"] * (1 << 20)
    world = point["world"]
    if device == "cuda" and world > have.gpus:
        return 0, f"needs {world} GPUs (one per rank), found {have.gpus}"
    disk = state * world * 1.1
    if disk > have.disk_free * FIT_MARGIN:
        return 0, f"a save writes {disk / gib:.1f} GiB; {have.disk_free / gib:.1f} GiB free on the scratch disk"
    host = HOST_FACTOR[device] * state * world
    fits = int(have.host_available * FIT_MARGIN // host)
    if fits < 1:
        return 0, f"a side needs about {host / gib:.1f} GiB of host memory; {have.host_available / gib:.1f} available"
    if device == "cuda":
        gpu = GPU_FACTOR * state
        on_gpu = int(have.gpu_free * FIT_MARGIN // gpu)
        if on_gpu < 1:
            return 0, f"a side needs about {gpu / gib:.1f} GiB per GPU; {have.gpu_free / gib:.1f} GiB free"
        fits = min(fits, on_gpu)
    return min(fits, peers), None


def resources(scratch: Path, device: str) -> Resources:
    """This machine's free host memory (MemAvailable), scratch disk and, with cuda, GPUs and the least free one."""
    available = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable"):
                available = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    gpus, free = 0, 0
    if device == "cuda":
        import torch

        gpus = torch.cuda.device_count()
        free = min((torch.cuda.mem_get_info(i)[0] for i in range(gpus)), default=0)
    return Resources(available, shutil.disk_usage(scratch).free, gpus, free)


def interpolate(x: float, known: dict[float, float]) -> float:
    """The value at x of the line through the two known points furthest apart (the only one's value if one),
    never below 0."""
    xs = sorted(known)
    if len(xs) == 1 or xs[0] == xs[-1]:
        return known[xs[0]]
    x0, x1 = xs[0], xs[-1]
    return max(0.0, known[x0] + (known[x1] - known[x0]) * (x - x0) / (x1 - x0))


def size_rounds(
    budget_s: float, fixed_s: list[float], round_s: list[float], minimum: int = 3, maximum: int = 20
) -> int:
    """Rounds per point that fit `budget_s`: each point costs its fixed time (starting its sides, their first
    saves, closing) and its round's time per round. At least `minimum` (what the budget cuts is then the largest
    points' last rounds), at most `maximum`."""
    per_round = sum(round_s)
    if per_round <= 0:
        return maximum
    fits = math.floor((budget_s - sum(fixed_s)) / per_round)
    return max(minimum, min(maximum, fits))


def probe_costs(
    peers: list[PeerSpec],
    points: list[dict],
    plan: dict[float, int],
    scratch: Path,
    device: str,
    probes: list[dict],
    deadline: float | None = None,
) -> tuple[dict[float, float], dict[float, float]]:
    """The first measurement: at the smallest and the largest point, every peer's first save and one round (the
    round left out where it would pass `deadline`), each probe appended to `probes` as measured. Returns, per
    probed value, the point's fixed time (the sides' start, their first saves, their close) and its round's (the
    first saves' where the round was left out: a pessimistic round, as a first save is the slowest)."""
    fixed, per_round = {}, {}
    for value in dict.fromkeys((points[0]["value"], points[-1]["value"])):
        chosen = next(p for p in points if p["value"] == value)
        began = time.monotonic()
        measured = measure_point(peers, chosen, 1, scratch / f"probe-{value:g}", device, plan[value], deadline)
        total = time.monotonic() - began
        rounds = [d["rounds"][0]["wall"] for d in measured["peers"].values() if d["rounds"]]
        firsts = [d["first"]["wall"] for d in measured["peers"].values() if "first" in d]
        per_round[value] = sum(rounds) if rounds else sum(firsts)
        fixed[value] = max(total - (sum(rounds) if rounds else 0.0), 0.0)
        probes.append({**measured, "fixed_s": fixed[value], "round_s": per_round[value]})
    return fixed, per_round


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
            data = point["peers"].get(label)
            if data is None:  # skipped, or dropped at an earlier point (the notes say why)
                continue
            if not data["rounds"]:
                first = _ms(data["first"]["committed"]) if "first" in data else "-"
                why = _short(data.get("error") or "no round within the budget")
                rows.append([f"{point['value']:g}", f"`{label}`", "-", "-", first, why, "-", "-"])
                continue
            stall = _median_interval([s["stall"] for s in data["rounds"]])
            committed = _median_interval([s["committed"] for s in data["rounds"]])
            phase = {k: statistics.median(phases_of(s)[k] for s in data["rounds"]) for k in PHASES}
            others = [max((r["committed"] for r in s["ranks"][1:]), default=None) for s in data["rounds"]]
            waits = [o for o in others if o is not None]
            rows.append(
                [
                    f"{point['value']:g}",
                    f"`{label}`" + _rounds_note(point, data, run["settings"]["rounds"]),
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
        if not g["x"]:
            fits.append([f"`{label}`", "-", "-", "-", "-", "-"])
            continue
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
    if s.get("device", "cpu") != "cpu":
        gpu = run["machine"].get("gpu")
        fixed_axes += f"; tensors on {s['device']}" + (f", {gpu}" if gpu else "")
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
                *_impl_marks(run),
                *_notes(run),
            ]
        )
        + "\n"
    )


# impl's phase marks (ckptspec/impl/phases.py) a sweep's table shows, each at its first occurrence in a save, or
# its last where several threads or files make it and the last is what the phase waits for.
IMPL_MARKS = (
    ("planned", "first"),
    ("handed over", "first"),
    ("snapshot", "first"),
    ("first byte", "first"),
    ("last byte", "last"),
    ("durable", "last"),
    ("finalize", "first"),
    ("committed", "first"),
)


def _impl_marks(run: dict) -> list[str]:
    """Where impl's time goes: for each peer whose saves carry impl's phase marks, the median time of each mark
    from start(), per point (an empty list where no peer has them)."""
    rows = []
    for point in run["points"]:
        for label, data in point["peers"].items():
            saves = [s for s in data.get("rounds", []) if s.get("marks")]
            if not saves:
                continue
            cells = []
            for name, which in IMPL_MARKS:
                times = [s["marks"][name][0 if which == "first" else 1] for s in saves if name in s["marks"]]
                cells.append(_ms(statistics.median(times)) if times else "-")
            rows.append([f"{point['value']:g}", f"`{label}`", *cells])
    if not rows:
        return []
    head = [AXES[run["axis"]], "peer", *(name for name, _ in IMPL_MARKS)]
    return [
        "",
        "Where impl's time goes (its phase marks, ckptspec/impl/phases.py): each mark's median time from start(), "
        "in ms.",
        "",
        *md_table(head, rows),
    ]


def _short(text: str) -> str:
    """An error's first line, short enough for a cell."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= 100 else line[:97] + "..."


def _rounds_note(point: dict, data: dict, rounds: int) -> str:
    """A note after the peer's name where it has other than the run's rounds at a point, saying why."""
    n = len(data["rounds"])
    if point.get("from_probe"):
        return f" ({n} round: the first measurement's; the budget left no more)"
    why = "cut by the budget" if point.get("cut") else _short(data.get("error", "")) or "as run"
    return "" if n == rounds else f" ({n} rounds: {why})"


def _notes(run: dict) -> list[str]:
    """What the run left out: points that did not fit or were not reached, peers skipped, groups of peers."""
    notes = [f"- {AXES[run['axis']]} {v:g} left out: {why}" for v, why in run.get("left_out", [])]
    notes += [f"- `{label}` skipped: {_short(why)}" for label, why in run.get("skipped", {}).items()]
    for point in run["points"]:
        if "groups" in point:
            groups = "; ".join(", ".join(g) for g in point["groups"])
            notes.append(
                f"- at {point['value']:g}, the peers ran in groups that fit memory, one after another: {groups}"
            )
    if "rounds_sized" in run:
        r = run["rounds_sized"]
        notes.append(
            f"- rounds sized from a first measurement: {r['rounds']} per point for a budget of {r['budget_s']:g} s "
            f"(probe {r['probe_s']:.0f} s; estimated {r['estimate_s']:.0f} s for the points)"
        )
    if run.get("interrupted"):
        notes.append("- the run was interrupted: the points above are those it had measured")
    return ["", *notes] if notes else []


def plot(run: dict, out: Path) -> None:
    """Time to committed against the axis per peer (log-log), and the phases of the largest point stacked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def measured(point: dict, label: str) -> list[dict]:
        return point["peers"].get(label, {}).get("rounds", [])

    # Peers with rounds at some point (a skipped peer has none); each line only through the points it measured.
    labels = [lb for lb in run["peers"] if any(measured(p, lb) for p in run["points"])]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label in labels:
        points = [p for p in run["points"] if measured(p, label)]
        xs = [p["value"] for p in points]
        committed = [_median_interval([s["committed"] for s in measured(p, label)]) for p in points]
        stalls = [statistics.median(s["stall"] for s in measured(p, label)) for p in points]
        (line,) = left.plot(xs, [c[0] for c in committed], marker="o", label=f"{label}: committed")
        # the 90% interval of each median, as a band
        left.fill_between(xs, [c[1] for c in committed], [c[2] for c in committed], color=line.get_color(), alpha=0.15)
        left.plot(xs, stalls, marker="x", linestyle="--", color=line.get_color(), label=f"{label}: stall")
    left.set_xscale("log")
    left.set_yscale("log")
    ticks = [p["value"] for p in run["points"]]
    left.set_xticks(ticks, [f"{t:g}" for t in ticks])
    left.minorticks_off()
    left.set_xlabel(AXES[run["axis"]])
    left.set_ylabel("seconds (median)")
    left.legend(fontsize=7)
    last = next(p for p in reversed(run["points"]) if any(measured(p, lb) for lb in labels))
    labels = [lb for lb in labels if measured(last, lb)]
    bottoms = [0.0] * len(labels)
    for phase in PHASES:
        heights = [statistics.median(phases_of(s)[phase] for s in measured(last, lb)) for lb in labels]
        right.barh(labels, heights, left=bottoms, label=phase)
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    right.set_xlabel(f"seconds, at {last['value']:g} {AXES[run['axis']]}")
    right.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=110)
    plt.close(fig)


CHECK = (
    "import json, sys\nfrom ckptspec.spec.harness.surface.loading import load_target\nout = {}\n"
    "for name in sys.argv[1:]:\n    try:\n        out[name] = [True, load_target(name).version]\n"
    "    except Exception as exc:\n        out[name] = [False, f'{type(exc).__name__}: {exc}']\nprint(json.dumps(out))\n"
)


def unavailable(peers: list[PeerSpec], cwd: Path) -> dict[str, str]:
    """Each peer whose adapter does not load in its side's environment, with why (one interpreter per distinct
    environment, all its adapters at once; run in `cwd`, a directory of no package, as a side's path holds none)."""
    by_env: dict[tuple, list[PeerSpec]] = {}
    for peer in peers:
        spec = peer.side()
        by_env.setdefault((spec.python, spec.pythonpath), []).append(peer)
    missing = {}
    for (python, _), group in by_env.items():
        env = group[0].side().environ()
        adapters = sorted({p.adapter for p in group})
        command = [python, "-c", CHECK, *adapters]
        done = subprocess.run(command, env=env, cwd=cwd, capture_output=True, text=True, check=False)
        try:
            loaded = json.loads(done.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            loaded = {a: [False, f"the check did not run: {done.stderr.strip()[-300:]}"] for a in adapters}
        missing.update({p.label: loaded[p.adapter][1] for p in group if not loaded[p.adapter][0]})
    return missing


def _stand_ins(run: dict) -> None:
    """Each probed point the run did not measure itself (the budget left it no time, or cut the run) gets the
    first measurement's round in its place, marked so (`from_probe`), the points kept in the axis' order."""
    measured = {p["value"] for p in run["points"]}
    for probe in run.get("probe", []):
        if probe["value"] in measured or not any(d["rounds"] for d in probe["peers"].values()):
            continue
        stand_in = {k: v for k, v in probe.items() if k not in ("fixed_s", "round_s")}
        run["points"].append({**stand_in, "cut": True, "from_probe": True})
    run["points"].sort(key=lambda p: p["value"])


def _write(run: dict, args: argparse.Namespace, load: tuple[float, ...]) -> dict:
    """The run as it stands (with its stand-ins) into --out and --table-out; returns what was written."""
    run["load"] = {"start": list(load), "end": list(os.getloadavg())}
    shown = {**run, "points": list(run["points"])}
    _stand_ins(shown)
    args.out.write_text(json.dumps(shown, indent=1) + "\n")
    if args.table_out is not None and shown["points"]:
        args.table_out.write_text(table(shown))
    return shown


def run_sweep(args: argparse.Namespace) -> int:
    try:
        peers = [parse_peer(p) for p in args.peer]
        values = sorted(float(v) for v in args.values.split(","))
    except ValueError as exc:
        print(f"sweep: {exc}", file=sys.stderr)
        return 2
    if len({p.label for p in peers}) != len(peers):
        print("sweep: two peers share a label (give LABEL=ADAPTER)", file=sys.stderr)
        return 2
    if args.device == "cuda" and not args.plan_only:
        first_world = int(values[0]) if args.axis == "ranks" else args.ranks
        if refused := device_problem(args.device, first_world):
            print(f"sweep: {refused}", file=sys.stderr)
            return 2
    began = time.monotonic()
    deadline = None if args.budget_s is None else began + args.budget_s
    load = os.getloadavg()
    run: dict = {
        "format": FORMAT,
        "axis": args.axis,
        "machine": machine(),
        "settings": {
            "size": args.size_mib,
            "tensors": args.tensors,
            "ranks": args.ranks,
            "rounds": args.rounds,
            "device": args.device,
        },
        "peers": {p.label: {"adapter": p.adapter, "python": p.python, "env": dict(p.env)} for p in peers},
        "points": [],
    }
    say: Callable[[str], None] = lambda line: print(f"sweep: {line}", flush=True)  # noqa: E731
    if args.device == "cuda" and device_problem("cuda") is None:
        import torch

        run["machine"].update(
            gpu=torch.cuda.get_device_name(0), gpus=torch.cuda.device_count(), cuda=torch.version.cuda
        )
    with scratch_dir() as tmp:
        run["skipped"] = unavailable(peers, tmp)
        peers = [p for p in peers if p.label not in run["skipped"]]
        for label, why in run["skipped"].items():
            say(f"{label} skipped: {why}")
        if not run["skipped"]:
            del run["skipped"]
        points = [_point(args.axis, value, args) for value in values]
        plan: dict[float, int] = {p["value"]: len(peers) for p in points}
        if args.fit_memory:
            refused = device_problem(args.device) if args.device == "cuda" else None
            have = resources(tmp, "cpu" if refused else args.device)
            run["resources"] = {**vars(have), **({"note": refused} if refused else {})}
            with contextlib.suppress(OSError):  # recorded, not gated: a peer that stages in shared memory needs it
                run["resources"]["shm_free"] = shutil.disk_usage("/dev/shm").free
            kept = []
            for point in points:
                fits, why = fit_point(point, len(peers), args.device, have)
                if refused and args.device == "cuda":  # a plan without a GPU: the GPU's limits are not known
                    fits, why = fit_point(point, len(peers), "cpu", have)
                if why:
                    run.setdefault("left_out", []).append([point["value"], why])
                    say(f"{args.axis} {point['value']:g} left out: {why}")
                else:
                    plan[point["value"]] = fits
                    kept.append(point)
            points = kept
        if args.plan_only or not points or not peers or len(points) < args.min_points:
            run["plan"] = {f"{p['value']:g}": plan[p["value"]] for p in points}
            if not args.plan_only and points and peers:
                run.setdefault("left_out", []).extend(
                    [p["value"], f"fewer than {args.min_points} points fit here"] for p in points
                )
            say(
                f"plan: {args.axis} -> peers started together {run['plan'] or 'none'}; peers {[p.label for p in peers]}"
            )
            _write(run, args, load)
            return 0
        rounds = args.rounds
        fixed_s = [0.0] * len(points)
        round_s = [0.0] * len(points)
        try:
            if args.budget_s is not None:
                probes: list[dict] = []
                run["probe"] = probes  # kept as measured, should the budget cut the probe itself
                fixed, per_round = probe_costs(peers, points, plan, tmp, args.device, probes, deadline)
                probe_s = time.monotonic() - began
                fixed_s = [interpolate(p["value"], fixed) for p in points]
                round_s = [interpolate(p["value"], per_round) for p in points]
                rounds = size_rounds(args.budget_s - probe_s, fixed_s, round_s, args.min_rounds, args.rounds)
                estimate = sum(fixed_s) + rounds * sum(round_s)
                run["settings"]["rounds"] = rounds
                run["rounds_sized"] = {
                    "rounds": rounds,
                    "budget_s": args.budget_s,
                    "probe_s": probe_s,
                    "estimate_s": estimate,
                }
                say(f"rounds {rounds} per point (probe {probe_s:.0f} s, estimate {estimate:.0f} s)")
                dropped = {lb for probe in probes for lb, d in probe["peers"].items() if "error" in d}
                for label in dropped:
                    why = next(pr["peers"][label]["error"] for pr in probes if "error" in pr["peers"][label])
                    run.setdefault("skipped", {})[label] = f"failed in the first measurement: {why}"
                peers = [p for p in peers if p.label not in dropped]
            probed = {pr["value"]: pr for pr in run.get("probe", []) if any(d["rounds"] for d in pr["peers"].values())}
            for i, point in enumerate(points):
                # Started only if it can take two rounds, more than the first measurement's one (which stands in).
                if deadline is not None and time.monotonic() + fixed_s[i] + 2 * round_s[i] > deadline:
                    if point["value"] in probed:  # _stand_ins puts the first measurement in its place
                        say(f"{args.axis} {point['value']:g}: the first measurement's round stands in (budget)")
                    else:
                        run.setdefault("left_out", []).append([point["value"], "not reached within the budget"])
                    continue
                say(f"{args.axis} {point['value']:g}")
                measured = measure_point(
                    peers, point, rounds, tmp / f"p{point['value']:g}", args.device, plan[point["value"]], deadline
                )
                run["points"].append(measured)
                for label, data in measured["peers"].items():
                    if "error" in data:
                        run.setdefault("skipped", {})[label] = f"failed at {point['value']:g}: {data['error']}"
                peers = [p for p in peers if "error" not in measured["peers"][p.label]]
                _write(run, args, load)
                if not peers:
                    break
            if not args.no_count and run["points"] and peers:
                first = run["points"][0]
                run["counted_at"] = first["value"]
                try:
                    run["counted"] = {
                        p.label: count_saves(
                            p.side(), first["size_mib"], first["tensors"], tmp / f"count-{p.label}", args.device
                        )
                        for p in peers
                    }
                except GateError as exc:
                    run["counted_note"] = str(exc)
        except KeyboardInterrupt:
            run["interrupted"] = True
    shown = _write(run, args, load)
    if shown["points"]:
        print(table(shown), end="")
    return 0


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
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
    r.add_argument("--device", choices=DEVICES, default="cpu", help="where the sides' tensors live (default cpu)")
    r.add_argument("--budget-s", type=float, help="size the rounds from a first measurement to fit this time")
    r.add_argument("--min-rounds", type=int, default=3, help="with --budget-s: at least this many rounds (3)")
    r.add_argument("--min-points", type=int, default=1, help="measure nothing unless this many points fit (1)")
    r.add_argument("--fit-memory", action="store_true", help="leave out the points this machine cannot hold")
    r.add_argument("--plan-only", action="store_true", help="print and store what would run; measure nothing")
    r.add_argument("--table-out", type=Path, help="write the table here as well (after every point)")
    r.add_argument("--out", type=Path, required=True)
    t = sub.add_parser("table", help="the tables of stored sweeps (no torch)")
    t.add_argument("runs", nargs="*", type=Path)
    t.add_argument("--update", type=Path)
    t.add_argument("--block", default="sweep")
    p = sub.add_parser("plot", help="the figure of one stored sweep (matplotlib)")
    p.add_argument("run", type=Path)
    p.add_argument("--out", type=Path, required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.command == "run":
        args.out.parent.mkdir(parents=True, exist_ok=True)
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
