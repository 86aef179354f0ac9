"""The baseline file: each figure's best over several runs of the regression set, and where they came from.

    {"format": "ckptspec-regression-baseline/1", "recorded": ISO time, "runs": N,
     "source": {"machine", "node", "python", "torch", "commit", "dirty", "datetime"},   # of the first run
     "settings": {"size_mib", "rounds", "threads", "pytest_args"},                      # how to run the set
     "figures": {NAME: {"figure", "peer", "seconds", "reference", "gated", "per_run": [seconds, ...]}}}

`best_of` keeps each figure's fastest round over the runs (a reference too, so the ratio of the baseline is
of two best figures); `load` refuses anything else with a `BaselineError` whose message is one line.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from pathlib import Path

from ckptspec.bench.regression.measure import Figure, Settings, figures_of, normalised, source_of

__all__ = ["FORMAT", "Baseline", "BaselineError", "best_of", "load", "scaled", "spread"]

FORMAT = "ckptspec-regression-baseline/1"


class BaselineError(Exception):
    """The baseline cannot be used; str() is one line naming the file and why."""


class Baseline:
    """A parsed baseline file."""

    def __init__(self, data: dict):
        self.data = data
        self.settings = Settings(**data["settings"])
        self.figures = {
            name: Figure(**{k: f[k] for k in Figure.__dataclass_fields__}) for name, f in data["figures"].items()
        }

    def value(self, name: str) -> tuple[float, str]:
        return normalised(name, self.figures)

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.data, indent=1) + "\n")


def best_of(runs: list[dict], settings: Settings) -> Baseline:
    """A baseline from pytest-benchmark JSONs of the same set: each figure's fastest round over the runs.

    A figure missing from some runs (a benchmark that failed or skipped there) keeps the runs that have it."""
    if not runs:
        raise ValueError("no runs to make a baseline of")
    per_run = [figures_of(run) for run in runs]
    figures: dict[str, dict] = {}
    for found in per_run:
        for name, fig in found.items():
            entry = figures.setdefault(name, dict(fig.as_dict(), per_run=[]))
            entry["per_run"].append(fig.seconds)
            entry["seconds"] = min(entry["seconds"], fig.seconds)
    data = {
        "format": FORMAT,
        "recorded": datetime.now(UTC).isoformat(timespec="seconds"),
        "runs": len(runs),
        "source": source_of(runs[0]),
        "settings": settings.as_dict(),
        "figures": dict(sorted(figures.items())),
    }
    return Baseline(data)


def spread(runs: list[dict]) -> dict[str, tuple[float, str]]:
    """Run-to-run spread of each figure as compared (normalised within its run): (max / min, unit)."""
    values: dict[str, list[float]] = {}
    units: dict[str, str] = {}
    for run in runs:
        found = figures_of(run)
        for name in found:
            value, units[name] = normalised(name, found)
            values.setdefault(name, []).append(value)
    return {name: (max(v) / min(v) if min(v) > 0 else math.inf, units[name]) for name, v in sorted(values.items())}


def load(path: Path) -> Baseline:
    """The baseline stored at `path`; BaselineError (one line) if it is missing, unreadable or malformed."""
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise BaselineError(f"baseline {path}: cannot read it ({exc.strerror or exc})") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BaselineError(f"baseline {path}: not JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise BaselineError(f"baseline {path}: not a {FORMAT} file (format: {found!r})")
    try:
        baseline = Baseline(data)
    except (KeyError, TypeError, AttributeError) as exc:
        raise BaselineError(f"baseline {path}: malformed ({type(exc).__name__}: {exc})") from None
    if not any(f.gated for f in baseline.figures.values()):
        raise BaselineError(f"baseline {path}: holds no gated figure")
    return baseline


def scaled(baseline: Baseline, factor: float) -> Baseline:
    """A copy with every gated figure's time times `factor` (references kept): 0.1 makes a baseline that a
    correct run must fail against, the check that the gate works."""
    data = json.loads(json.dumps(baseline.data))
    for entry in data["figures"].values():
        if entry["gated"]:
            entry["seconds"] *= factor
            entry["per_run"] = [s * factor for s in entry["per_run"]]
    data["scaled_by"] = factor * baseline.data.get("scaled_by", 1.0)
    return Baseline(data)
