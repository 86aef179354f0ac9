"""A run of the regression set against a baseline: each figure's ratio, and the verdict.

Each figure is taken as it is normalised in its own run (divided by its reference measured in the same run,
`measure.normalised`), and divided by the baseline's figure normalised the same way: `ratio` > threshold is a
regression of a gated figure. References (ceilings, `none`) get a ratio too, reported and never gated.
A gated figure of the baseline that the run lacks fails the comparison; one the baseline lacks is reported.

Threshold: `--threshold` or the environment variable THRESHOLD_ENV, a factor (3 = fail when a figure took
more than 3x the baseline's), default DEFAULT_THRESHOLD.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass

from ckptspec.bench.figures import md_table
from ckptspec.bench.regression.baseline import Baseline
from ckptspec.bench.regression.measure import Figure, normalised

__all__ = [
    "DEFAULT_THRESHOLD",
    "THRESHOLD_ENV",
    "Row",
    "compare",
    "elsewhere",
    "render",
    "threshold_from",
    "verdict_line",
]

THRESHOLD_ENV = "CKPTSPEC_BENCH_THRESHOLD"
DEFAULT_THRESHOLD = 3.0


def threshold_from(option: str | None) -> float:
    """The threshold factor from the option, else the environment, else the default; ValueError (one line)."""
    text = option if option is not None else os.environ.get(THRESHOLD_ENV)
    if text is None or not text.strip():
        return DEFAULT_THRESHOLD
    try:
        value = float(text.strip().removesuffix("x"))
    except ValueError:
        raise ValueError(f"threshold {text!r} is not a number (a factor such as 3 or 5)") from None
    if not value > 1:
        raise ValueError(f"threshold {text!r} must be a factor above 1 (3 = fail above 3x the baseline)")
    return value


@dataclass(frozen=True)
class Row:
    """One figure of the comparison; `ratio` None when only one side has it."""

    name: str
    gated: bool
    value: float | None
    baseline: float | None
    unit: str
    ratio: float | None
    status: str  # ok, REGRESSED, MISSING, reference, new

    @property
    def failed(self) -> bool:
        return self.status in ("REGRESSED", "MISSING")

    def as_dict(self) -> dict:
        return asdict(self)


def compare(baseline: Baseline, run: dict[str, Figure], threshold: float) -> list[Row]:
    """Every figure of the baseline and the run, gated figures first."""
    rows = []
    for name in sorted(set(baseline.figures) | set(run), key=lambda n: (not _gated(n, baseline, run), n)):
        gated = _gated(name, baseline, run)
        if name not in run:
            value, unit = baseline.value(name)
            status = "MISSING" if gated else "reference"
            rows.append(Row(name, gated, None, value, unit, None, status))
            continue
        value, unit = normalised(name, run)
        if name not in baseline.figures:
            rows.append(Row(name, gated, value, None, unit, None, "new"))
            continue
        base, base_unit = baseline.value(name)
        if base_unit != unit:  # one side lacks the reference: compare the absolute times
            value, base, unit = run[name].seconds, baseline.figures[name].seconds, "s"
        ratio = value / base if base > 0 else float("inf")
        status = "reference" if not gated else ("REGRESSED" if ratio > threshold else "ok")
        rows.append(Row(name, gated, value, base, unit, ratio, status))
    return rows


def _gated(name: str, baseline: Baseline, run: dict[str, Figure]) -> bool:
    fig = run.get(name) or baseline.figures[name]
    return fig.gated


def _fmt(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.3g} ms" if unit == "s" else f"{value:.3g} {unit}"


def render(rows: list[Row], threshold: float) -> str:
    """The table of every figure, then one line per failed figure."""
    table = md_table(
        ["figure", "this run", "baseline", "ratio", "verdict"],
        [
            [
                f"`{r.name}`",
                _fmt(r.value, r.unit),
                _fmt(r.baseline, r.unit),
                "-" if r.ratio is None else f"{r.ratio:.2f}x",
                r.status if r.gated or r.status != "reference" else "reference (not gated)",
            ]
            for r in rows
        ],
    )
    lines = [
        f"{r.status} {r.name}: "
        + (
            "in the baseline, not in this run"
            if r.ratio is None
            else f"{_fmt(r.value, r.unit)}, baseline {_fmt(r.baseline, r.unit)}: {r.ratio:.2f}x > {threshold:g}x"
        )
        for r in rows
        if r.failed
    ]
    return "\n".join([*table, "", *lines]) + "\n"


def verdict_line(rows: list[Row], threshold: float, baseline_path: str) -> str:
    """One line: PASS or FAIL, how many gated figures, against what."""
    gated = [r for r in rows if r.gated]
    failed = [r for r in gated if r.failed]
    if failed:
        names = ", ".join(r.name for r in failed)
        return (
            f"FAIL: {len(failed)} of {len(gated)} gated figures beyond {threshold:g}x the baseline {baseline_path} "
            f"or missing ({names})"
        )
    return f"PASS: {len(gated)} gated figures within {threshold:g}x the baseline {baseline_path}"


def elsewhere(baseline_source: dict, run_source: dict) -> list[str]:
    """What differs between where the baseline was recorded and where the run ran (machine, Python, torch):
    reported, not failed, since a baseline from another machine is allowed but weak."""
    return [
        f"the baseline's {key} is {baseline_source.get(key)}, this run's {run_source.get(key)}"
        for key in ("machine", "python", "torch")
        if baseline_source.get(key) != run_source.get(key)
    ]
