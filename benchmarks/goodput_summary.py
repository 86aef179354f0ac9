"""The goodput benchmark's figures and tables (benchmarks/test_goodput.py), for `benchmarks.summary`.

    figures(run)          # {(peer, interval): Figures}
    render(run)           # one table per save interval, absolute times and ratios, and the goals
    render_compact(run)   # one table for the README: each peer over every interval, and the goals

Per run of a peer at a save interval, against the run without checkpointing (`none`) at the same interval:

- slowdown: wall time / the baseline's wall time - 1;
- goodput: steps x the baseline's median step time / wall time (the share of the wall time that trained);
- stall per save: the trainer's time in `peer.save`, plus, in the per-interval tables, the wait for the
  previous save when it was still in flight (`wait`);
- interference: median time of the steps that started with a save in flight / median time of the others - 1;
- time to durable: from the save call to the poll (or wait) that found it finalized;
- host memory: the PSS of the process tree over what it was before the peer started, after its first save
  (`standing`: worker, retained buffers) and at its largest during the run (`peak extra`);
- snapshots: how many checkpoints were loaded and compared with their step's fingerprint, and how many
  differed. A peer with a wrong snapshot is marked and never ranked.

Stall and time to durable are also given in steps (divided by the baseline's median step time), the unit
that means something on any machine.
"""

from __future__ import annotations

from dataclasses import dataclass

from benchmarks.figures import Run, fmt_bytes, fmt_time, md_table

__all__ = ["Figures", "figures", "goals", "order", "render", "render_compact", "wrong_peers"]

FIGURE = "goodput"
BASELINE = "none"
IMPL_PEERS = ("dcp:impl", "dcp:impl-temporal", "torch:impl", "torch:impl-temporal")
GOAL_SLOWDOWN = 0.01  # impl's slowdown at the longest interval


@dataclass
class Figures:
    """One run of a peer at a save interval, against the baseline run at that interval."""

    peer: str
    interval: int
    steps: int
    slowdown: float
    goodput: float
    base_step_s: float
    saves: int
    stall_s: float | None  # median over the saves: the save call
    wait_s: float | None  # median over the saves: waiting for the previous save first
    durable_s: float | None
    interference: float | None
    in_flight_steps: int
    peak_extra_bytes: int
    standing_bytes: int
    state_bytes: int
    checked: int
    wrong: int

    @property
    def correct(self) -> bool:
        return self.wrong == 0


def _median(values) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _interference(row: dict) -> tuple[float | None, int]:
    busy = [t for t, f in zip(row["step_s"], row["in_flight"], strict=True) if f]
    idle = _median(t for t, f in zip(row["step_s"], row["in_flight"], strict=True) if not f)
    busy_median = _median(busy)
    if busy_median is None or not idle:
        return None, len(busy)
    return busy_median / idle - 1, len(busy)


def figures(run: Run) -> dict[tuple[str, int], Figures]:
    """The figures of every goodput run that has a baseline run at its interval."""
    rows = {(r["peer"], r["interval"]): r for r in run.get(FIGURE)}
    out = {}
    for (peer, interval), r in rows.items():
        base = rows.get((BASELINE, interval))
        if base is None:
            continue
        base_step = _median(base["step_s"]) or float("nan")
        saves = r["saves"]
        interference, in_flight = _interference(r)
        out[peer, interval] = Figures(
            peer=peer,
            interval=interval,
            steps=r["steps"],
            slowdown=r["wall_s"] / base["wall_s"] - 1,
            goodput=r["steps"] * base_step / r["wall_s"],
            base_step_s=base_step,
            saves=len(saves),
            stall_s=_median(s["call_s"] for s in saves),
            wait_s=_median(s["wait_s"] for s in saves),
            durable_s=_median(s["durable_s"] for s in saves),
            interference=interference,
            in_flight_steps=in_flight,
            peak_extra_bytes=r["peak_extra_bytes"],
            standing_bytes=r["standing_bytes"],
            state_bytes=r["bytes"],
            checked=len(saves) if peer != BASELINE else 0,
            wrong=len(r["wrong_snapshots"]),
        )
    return out


def _intervals(found: dict[tuple[str, int], Figures]) -> list[int]:
    return sorted({interval for _, interval in found})


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value * 100:+.1f}%"


def _steps(seconds: float | None, step_s: float) -> str:
    return "-" if seconds is None else f"{seconds / step_s:.2f}"


def _snapshots(runs: list[Figures]) -> str:
    """The verdict over `runs` of one peer: every checkpoint loaded held its step's state, or how many did not."""
    if not runs or runs[0].peer == BASELINE:
        return "-"
    checked, wrong = sum(f.checked for f in runs), sum(f.wrong for f in runs)
    return f"correct ({checked})" if not wrong else f"**WRONG SNAPSHOT** ({wrong} of {checked})"


def wrong_peers(found: dict[tuple[str, int], Figures]) -> set[str]:
    """The peers with a checkpoint that did not hold its step's state, at any interval: never ranked."""
    return {peer for (peer, _), f in found.items() if not f.correct}


def _correct(found: dict[tuple[str, int], Figures], interval: int) -> list[Figures]:
    """The runs at `interval` of the peers whose every checkpoint held its step's state (baseline excluded)."""
    wrong = wrong_peers(found)
    return [f for (peer, n), f in found.items() if n == interval and peer != BASELINE and peer not in wrong]


def _ranks(found: dict[tuple[str, int], Figures], interval: int) -> dict[str, int]:
    """Rank by slowdown at `interval` of the peers whose every checkpoint held its step's state."""
    ranked = sorted(_correct(found, interval), key=lambda f: f.slowdown)
    return {f.peer: i + 1 for i, f in enumerate(ranked)}


def order(found: dict[tuple[str, int], Figures], interval: int) -> list[str]:
    """Baseline first, then the correct peers by slowdown at `interval`, then the wrong ones."""
    peers, wrong = {peer for peer, n in found if n == interval}, wrong_peers(found)
    return sorted(peers, key=lambda peer: (peer != BASELINE, peer in wrong, found[peer, interval].slowdown))


def _interval_table(found: dict[tuple[str, int], Figures], interval: int) -> list[str]:
    ranks, wrong = _ranks(found, interval), wrong_peers(found)
    rows = []
    for peer in order(found, interval):
        f = found[peer, interval]
        elsewhere = ", WRONG at another interval" if f.correct and peer in wrong else ""
        rows.append(
            [
                f"`{peer}`",
                _snapshots([f]) + elsewhere,
                _pct(f.slowdown),
                f"{f.goodput:.3f}",
                str(f.saves),
                f"{fmt_time(f.stall_s)} ({_steps(f.stall_s, f.base_step_s)})",
                f"{fmt_time(f.wait_s)} ({_steps(f.wait_s, f.base_step_s)})",
                f"{_pct(f.interference)} ({f.in_flight_steps})",
                f"{fmt_time(f.durable_s)} ({_steps(f.durable_s, f.base_step_s)})",
                f"{fmt_bytes(f.standing_bytes)} ({f.standing_bytes / f.state_bytes:.2f}x)",
                f"{fmt_bytes(f.peak_extra_bytes)} ({f.peak_extra_bytes / f.state_bytes:.2f}x)",
                str(ranks.get(peer, "-")),
            ]
        )
    header = [
        "peer",
        "snapshots",
        "slowdown",
        "goodput",
        "saves",
        "stall per save (steps)",
        "wait for previous (steps)",
        "interference (steps in flight)",
        "to durable (steps)",
        "standing host memory (x state)",
        "peak extra host memory (x state)",
        "rank",
    ]
    return md_table(header, rows)


def _pooled_interference(run: Run, peer: str) -> float | None:
    """Interference over every run of `peer`: its in-flight steps, each over its own run's other steps."""
    ratios = []
    for r in run.get(FIGURE, peer):
        idle = _median(t for t, f in zip(r["step_s"], r["in_flight"], strict=True) if not f)
        if idle:
            ratios += [t / idle for t, f in zip(r["step_s"], r["in_flight"], strict=True) if f]
    pooled = _median(ratios)
    return None if pooled is None else pooled - 1


def _notes(run: Run, found: dict[tuple[str, int], Figures]) -> list[str]:
    rows = run.get(FIGURE)
    base = [r["wall_s"] / r["steps"] for r in rows if r["peer"] == BASELINE]
    loads = [x for r in rows for x in r.get("load_average", [])]
    any_run = next(iter(found.values()))
    lines = [
        f"Training state {fmt_bytes(any_run.state_bytes)} (MLP parameters and Adam's two moments), "
        + ", ".join(f"{f.steps} steps every {f.interval}" for (p, _), f in sorted(found.items()) if p == BASELINE)
        + f"; baseline step {fmt_time(any_run.base_step_s)}. Slowdown: wall time against the run without "
        "checkpointing at the same interval; goodput: steps x the baseline's median step time / wall time; "
        "stall, time to durable in baseline steps; interference pooled over every run.",
    ]
    if len(base) > 1:
        lines.append(
            f"Noise: the {len(base)} baseline runs differ by {(max(base) / min(base) - 1) * 100:.1f}% in wall time "
            f"per step; load average {min(loads):.1f} to {max(loads):.1f} during the runs."
        )
    if not run.info.get("gpu"):
        lines.append("On a CPU-only machine absolute times say little about a GPU trainer; read the ratios.")
    return lines


def _noise(run: Run) -> float:
    base = [r["wall_s"] / r["steps"] for r in run.get(FIGURE) if r["peer"] == BASELINE]
    return max(base) / min(base) - 1 if len(base) > 1 else 0.0


def goals(run: Run) -> list[str]:
    """impl's goals: the lowest slowdown of the peers with correct snapshots at every interval, within the
    noise of the baseline runs, and under GOAL_SLOWDOWN at the longest interval."""
    found = figures(run)
    intervals = _intervals(found)
    if not intervals:
        return []
    noise, parts, met = _noise(run), [], True
    best_impl = {}
    for interval in intervals:
        correct = _correct(found, interval)
        impl = min((f for f in correct if f.peer in IMPL_PEERS), key=lambda f: f.slowdown, default=None)
        other = min((f for f in correct if f.peer not in IMPL_PEERS), key=lambda f: f.slowdown, default=None)
        if impl is None:
            met = False
            parts.append(f"every {interval}: no impl peer with correct snapshots")
            continue
        best_impl[interval] = impl
        if other is not None:
            met = met and impl.slowdown <= other.slowdown + noise
            parts.append(
                f"every {interval}: `{impl.peer}` {_pct(impl.slowdown)} vs `{other.peer}` {_pct(other.slowdown)}"
            )
    mark = "x" if met else " "
    lines = [
        f"- [{mark}] impl has the lowest slowdown of the peers with correct snapshots at every interval "
        f"(within the baseline noise, {noise * 100:.1f}%): " + "; ".join(parts)
    ]
    longest = intervals[-1]
    impl = best_impl.get(longest)
    if impl is None:
        lines.append(f"- [ ] impl slowdown under {GOAL_SLOWDOWN:.0%} every {longest} steps: not measured")
    else:
        mark = "x" if impl.slowdown < GOAL_SLOWDOWN else " "
        lines.append(
            f"- [{mark}] impl slowdown under {GOAL_SLOWDOWN:.0%} every {longest} steps: "
            f"`{impl.peer}` {_pct(impl.slowdown)}"
        )
    return lines


def render(run: Run, heading: str = "###") -> list[str]:
    """One table per save interval, the notes and the goals ([] if the run has no goodput rows)."""
    found = figures(run)
    if not found:
        return []
    lines = [f"{heading}# Goodput: training while saving every N steps", "", *_notes(run, found), ""]
    for interval in _intervals(found):
        lines += [f"Every {interval} steps:", "", *_interval_table(found, interval), ""]
    return lines + ["Goals for impl:", "", *goals(run), ""]


def render_compact(run: Run) -> list[str]:
    """The README's table: every peer over every interval, the notes and the goals ([] if no goodput rows)."""
    found = figures(run)
    if not found:
        return []
    intervals = _intervals(found)
    longest = intervals[-1]
    ranks = _ranks(found, longest)
    gpu = bool(run.info.get("gpu"))
    rows = []
    for peer in order(found, longest):
        mine = [found.get((peer, n)) for n in intervals]
        last = found[peer, longest]
        saves = [s for r in run.get(FIGURE, peer) for s in r["saves"]]
        stall, durable = _median(s["call_s"] for s in saves), _median(s["durable_s"] for s in saves)
        rows.append(
            [
                f"`{peer}`",
                _snapshots([f for f in mine if f]),
                " / ".join(_pct(f.slowdown) if f else "-" for f in mine),
                " / ".join(f"{f.goodput:.3f}" if f else "-" for f in mine),
                _timed(stall, last.base_step_s, gpu),
                _pct(_pooled_interference(run, peer)),
                _timed(durable, last.base_step_s, gpu),
                f"{max(f.peak_extra_bytes for f in mine if f) / last.state_bytes:.2f}x",
                str(ranks.get(peer, "-")),
            ]
        )
    every = " / ".join(str(n) for n in intervals)
    header = [
        "peer",
        "snapshots",
        f"slowdown, every {every} steps",
        f"goodput, every {every}",
        "stall per save (steps)",
        "interference",
        "to durable (steps)",
        "peak extra host memory / state",
        f"rank every {longest}",
    ]
    return [*md_table(header, rows), "", *_notes(run, found), "", "Goals for impl:", "", *goals(run), ""]


def _timed(seconds: float | None, step_s: float, absolute: bool) -> str:
    """In baseline steps; with the time first when `absolute` (a GPU run)."""
    steps = _steps(seconds, step_s)
    return f"{fmt_time(seconds)} ({steps})" if absolute and seconds is not None else steps
