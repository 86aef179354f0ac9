"""The goodput benchmark's figures and tables (ckptspec/bench/test_goodput.py), for `ckptspec.bench.summary`.

    figures(run)          # {(peer, interval): Figures}
    render(run)           # one table per save interval, absolute times and ratios, and the goals
    render_compact(run)   # one table for docs/benchmarks.md: each peer over every interval, and the goals

A run's figures are paired within the run, so that a machine whose load changes between runs (a shared CI
runner) moves them little. The step time `m` of a run is the median of its steps that began with no save in
flight (the baseline's, at the same interval, when fewer than MIN_IDLE_STEPS did). Then:

- overhead: the stalls (each save's call, and the wait for the previous save when it was still in flight),
  the final wait, and what the steps that began with a save in flight took beyond `m`;
- slowdown: overhead / (steps x m); goodput: steps x m / (steps x m + overhead), the share of the run's
  time that trained;
- wall vs baseline: wall time / the wall time of the run without checkpointing (`none`) at the same
  interval - 1, the direct measure, only as good as the baseline runs agree (the notes give their spread);
- idle drift: m / the baseline's median step - 1: a cost that slows every step (a busy worker) shows
  here and in wall vs baseline, not in the slowdown;
- interference: median of the steps that began with a save in flight / m - 1; inflation: the same steps over the
  baseline's median step - 1 (against the loop without checkpointing, in the same run);
- wait before the next change: the `before_update()` of the first step after a save, where a peer that stages in
  the background makes the trainer wait until it may change the state (median over the saves; part of that step);
- time to durable: from the save call to the poll (or wait) that found it finalized;
- host memory: the PSS of the process tree over what it was before the peer started, after its first save
  (`standing`: worker, retained buffers) and at its largest during the run (`peak extra`);
- snapshots: how many checkpoints were loaded and compared with their step's fingerprint, and how many
  differed. A peer with a wrong snapshot, at any interval, is marked and never ranked.

Stall and time to durable are also given in steps (divided by `m`), the unit that carries over between
machines.
"""

from __future__ import annotations

from dataclasses import dataclass

from ckptspec.bench.figures import BenchmarkRun, fmt_bytes, fmt_time, md_table

__all__ = ["Figures", "alone", "figures", "goals", "order", "render", "render_compact", "wrong_peers"]

FIGURE = "goodput"
BASELINE = "none"
IMPL_PEERS = ("dcp:impl", "dcp:impl-temporal", "dcp:impl-overlapped", "torch:impl", "torch:impl-temporal")
GOAL_SLOWDOWN = 0.01  # impl's slowdown at the longest interval
MIN_IDLE_STEPS = 5  # fewer steps without a save in flight give no steady median


@dataclass
class Figures:
    """One run of a peer at a save interval (seconds, bytes; ratios as fractions)."""

    peer: str
    interval: int
    steps: int
    step_s: float  # m: the median step that began with no save in flight
    overhead_s: float
    wall_vs_base: float
    drift: float
    saves: int
    stall_s: float | None  # median over the saves: the save call
    wait_s: float | None  # median over the saves: waiting for the previous save first
    durable_s: float | None
    interference: float | None
    update_wait_s: float | None  # median over the saves: the next step's wait before it may change the state
    inflation: float | None  # the steps with a save in flight against the baseline's median step
    in_flight_steps: int
    peak_extra_bytes: int
    standing_bytes: int
    state_bytes: int
    checked: int
    wrong: int

    @property
    def slowdown(self) -> float:
        return self.overhead_s / (self.steps * self.step_s)

    @property
    def goodput(self) -> float:
        return 1 / (1 + self.slowdown)

    @property
    def correct(self) -> bool:
        return self.wrong == 0


def _median(values) -> float | None:
    ordered = sorted(values)
    if not ordered:
        return None
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2


def _split(row: dict) -> tuple[list[float], list[float]]:
    """A run's step times: (began with a save in flight, the others)."""
    busy = [t for t, f in zip(row["step_s"], row["in_flight"], strict=True) if f]
    idle = [t for t, f in zip(row["step_s"], row["in_flight"], strict=True) if not f]
    return busy, idle


def figures(run: BenchmarkRun) -> dict[tuple[str, int], Figures]:
    """The figures of every goodput run that has a baseline run at its interval."""
    rows = {(r["peer"], r["interval"]): r for r in run.get(FIGURE)}
    out = {}
    for (peer, interval), r in rows.items():
        base = rows.get((BASELINE, interval))
        if base is None:
            continue
        base_step = _median(base["step_s"]) or float("nan")
        busy, idle = _split(r)
        m = (_median(idle) if len(idle) >= MIN_IDLE_STEPS else None) or base_step
        saves = r["saves"]
        stalls = sum(s["wait_s"] + s["call_s"] for s in saves)
        busy_median = _median(busy)
        out[peer, interval] = Figures(
            peer=peer,
            interval=interval,
            steps=r["steps"],
            step_s=m,
            overhead_s=stalls + r["final_wait_s"] + sum(t - m for t in busy),
            wall_vs_base=r["wall_s"] / base["wall_s"] - 1,
            drift=m / base_step - 1,
            saves=len(saves),
            stall_s=_median(s["call_s"] for s in saves),
            wait_s=_median(s["wait_s"] for s in saves),
            durable_s=_median(s["durable_s"] for s in saves),
            interference=None if busy_median is None else busy_median / m - 1,
            update_wait_s=_median(s["update_wait_s"] for s in saves if s.get("update_wait_s") is not None),
            inflation=None if busy_median is None else busy_median / base_step - 1,
            in_flight_steps=len(busy),
            peak_extra_bytes=r["peak_extra_bytes"],
            standing_bytes=r["standing_bytes"],
            state_bytes=r["bytes"],
            checked=len(saves) if peer != BASELINE else 0,
            wrong=len(r["wrong_snapshots"]),
        )
    return out


def alone(run: BenchmarkRun) -> bool:
    """A run of the goodput benchmark alone (`-k goodput`): no save figures, so no save goals either."""
    return bool(run.get(FIGURE)) and not run.get("stall")


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
    return f"correct ({checked})" if not wrong else f"**wrong snapshot** ({wrong} of {checked}, CPU tensors)"


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
                _pct(f.wall_vs_base),
                _pct(f.drift),
                str(f.saves),
                f"{fmt_time(f.stall_s)} ({_steps(f.stall_s, f.step_s)})",
                f"{fmt_time(f.wait_s)} ({_steps(f.wait_s, f.step_s)})",
                f"{fmt_time(f.update_wait_s)} ({_steps(f.update_wait_s, f.step_s)})",
                f"{_pct(f.interference)} ({f.in_flight_steps})",
                _pct(f.inflation),
                f"{fmt_time(f.durable_s)} ({_steps(f.durable_s, f.step_s)})",
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
        "wall vs baseline",
        "idle drift",
        "saves",
        "stall per save (steps)",
        "wait for previous (steps)",
        "wait before next change (steps)",
        "interference (steps in flight)",
        "inflation vs no checkpointing",
        "to durable (steps)",
        "standing host memory (x state)",
        "peak extra host memory (x state)",
        "rank",
    ]
    return md_table(header, rows)


def _pooled(run: BenchmarkRun, found: dict[tuple[str, int], Figures], peer: str) -> dict[str, float | None]:
    """Medians over every run of `peer`: save call and time to durable (seconds, and in steps of each
    run's own m), and interference (each in-flight step over its run's m)."""
    call, durable, busy, update = [], [], [], []
    for r in run.get(FIGURE, peer):
        f = found.get((peer, r["interval"]))
        if f is None:
            continue
        call += [(s["call_s"], s["call_s"] / f.step_s) for s in r["saves"]]
        durable += [(s["durable_s"], s["durable_s"] / f.step_s) for s in r["saves"]]
        update += [(u, u / f.step_s) for s in r["saves"] if (u := s.get("update_wait_s")) is not None]
        busy += [t / f.step_s for t in _split(r)[0]]
    interference = _median(busy)
    return {
        "call_s": _median(c for c, _ in call),
        "call_steps": _median(c for _, c in call),
        "durable_s": _median(d for d, _ in durable),
        "durable_steps": _median(d for _, d in durable),
        "update_s": _median(u for u, _ in update),
        "update_steps": _median(u for _, u in update),
        "interference": None if interference is None else interference - 1,
    }


def _notes(run: BenchmarkRun, found: dict[tuple[str, int], Figures]) -> list[str]:
    rows = run.get(FIGURE)
    loads = [x for r in rows for x in r.get("load_average", [])]
    base = sorted((f for (p, _), f in found.items() if p == BASELINE), key=lambda f: f.interval)
    lines = [
        f"Training state {fmt_bytes(base[0].state_bytes)} (MLP parameters and Adam's two moments), "
        + ", ".join(f"{f.steps} steps saving every {f.interval}" for f in base)
        + f"; baseline step {fmt_time(_median(f.step_s for f in base))}. Slowdown: the stalls, the final wait and "
        "what the steps with a save in flight took beyond the run's other steps, over the run's training time; "
        "goodput = 1 / (1 + slowdown); stall and time to durable in steps of the same run; host memory includes "
        "what training itself allocates during the run (gradients, the allocator's caches: the `none` row). The full "
        "summary adds, per interval, the wall time against the run without checkpointing."
    ]
    spread = _noise(run)
    loads_text = f"load average {min(loads):.1f} to {max(loads):.1f} during the runs" if loads else ""
    if spread is not None:
        lines.append(
            f"Noise: the {len(base)} baseline runs differ by {spread * 100:.1f}% in wall time per step "
            f"(the wall time against the baseline is no better than that); {loads_text}."
        )
    elif loads_text:
        lines.append(loads_text[0].upper() + loads_text[1:] + ".")
    if not run.info.get("gpu"):
        lines.append("On a CPU-only machine absolute times say little about a GPU trainer; read the ratios.")
    return lines


def _noise(run: BenchmarkRun) -> float | None:
    base = [r["wall_s"] / r["steps"] for r in run.get(FIGURE) if r["peer"] == BASELINE]
    return max(base) / min(base) - 1 if len(base) > 1 else None


def goals(run: BenchmarkRun) -> list[str]:
    """impl's goals: the lowest slowdown of the peers with correct snapshots at every interval, and under
    GOAL_SLOWDOWN at the longest interval. impl's best peer at each interval stands for impl."""
    found = figures(run)
    intervals = _intervals(found)
    if not intervals:
        return []
    parts, met, best_impl = [], True, {}
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
            met = met and impl.slowdown <= other.slowdown
            parts.append(
                f"every {interval}: `{impl.peer}` {_pct(impl.slowdown)} vs `{other.peer}` {_pct(other.slowdown)}"
            )
    mark = "x" if met else " "
    lines = [
        f"- [{mark}] impl has the lowest slowdown of the peers with correct snapshots at every interval: "
        + "; ".join(parts)
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


def render(run: BenchmarkRun, heading: str = "###") -> list[str]:
    """One table per save interval, the notes and the goals ([] if the run has no goodput rows)."""
    found = figures(run)
    if not found:
        return []
    lines = [f"{heading}# Goodput: training while saving every N steps", "", *_notes(run, found), ""]
    for interval in _intervals(found):
        lines += [f"Every {interval} steps:", "", *_interval_table(found, interval), ""]
    return [*lines, "Goals for impl:", "", *goals(run), ""]


def render_compact(run: BenchmarkRun) -> list[str]:
    """The table of docs/benchmarks.md: every peer over every interval, the notes and the goals ([] if no goodput rows)."""
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
        pooled = _pooled(run, found, peer)
        rows.append(
            [
                f"`{peer}`",
                _snapshots([f for f in mine if f]),
                " / ".join(_pct(f.slowdown) if f else "-" for f in mine),
                " / ".join(f"{f.goodput:.3f}" if f else "-" for f in mine),
                _timed(pooled["call_s"], pooled["call_steps"], gpu),
                _timed(pooled["update_s"], pooled["update_steps"], gpu),
                _pct(pooled["interference"]),
                " / ".join(_pct(f.inflation) if f else "-" for f in mine),
                _timed(pooled["durable_s"], pooled["durable_steps"], gpu),
                f"{max(f.peak_extra_bytes / f.state_bytes for f in mine if f):.2f}x",
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
        "wait before next change (steps)",
        "interference",
        f"inflation vs no checkpointing, every {every}",
        "to durable (steps)",
        "peak extra host memory / state",
        f"rank every {longest}",
    ]
    return [*md_table(header, rows), "", *_notes(run, found), "", "Goals for impl:", "", *goals(run), ""]


def _timed(seconds: float | None, steps: float | None, absolute: bool) -> str:
    """In steps; with the time first when `absolute` (a GPU run)."""
    in_steps = "-" if steps is None else f"{steps:.2f}"
    return f"{fmt_time(seconds)} ({in_steps})" if absolute and seconds is not None else in_steps
