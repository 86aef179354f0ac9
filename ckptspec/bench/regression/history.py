"""History of the regression pass: one JSON line per compared run, and the trend of each figure as a PNG.

A line (`entry`):

    {"time": ISO, "commit": SHA, "dirty": bool, "source": {...}, "baseline": PATH, "threshold": 3.0,
     "passed": bool, "figures": {NAME: Row as a dict (value, baseline, unit, ratio, status, gated)}}

`trend` draws one panel per figure: its value in each run (normalised as compared, `measure.normalised`) over
the runs in file order, labelled by commit, the baseline's value and the threshold above it dashed, runs that
failed the figure in red. matplotlib comes with the `bench` extra.
"""

from __future__ import annotations

import json
import math
import re
from datetime import UTC, datetime
from pathlib import Path

from ckptspec.bench.regression.compare import Row

__all__ = ["HistoryError", "append", "entry", "label", "read", "trend"]


class HistoryError(Exception):
    """The history cannot be used; str() is one line."""


def entry(rows: list[Row], *, source: dict, commit: str | None, baseline: str, threshold: float) -> dict:
    return {
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit or source.get("commit"),
        "dirty": source.get("dirty"),
        "source": source,
        "baseline": baseline,
        "threshold": threshold,
        "passed": not any(r.failed for r in rows if r.gated),
        "figures": {r.name: r.as_dict() for r in rows},
    }


def append(path: Path, line: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as out:
        out.write(json.dumps(line, sort_keys=True) + "\n")


def read(path: Path) -> list[dict]:
    """The entries of a history file; HistoryError if it is missing, empty or has a line that is not an entry."""
    try:
        text = path.read_text()
    except OSError as exc:
        raise HistoryError(f"history {path}: cannot read it ({exc.strerror or exc})") from None
    entries = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            found = json.loads(line)
        except json.JSONDecodeError as exc:
            raise HistoryError(f"history {path}:{number}: not JSON ({exc})") from None
        if not isinstance(found, dict) or not isinstance(found.get("figures"), dict):
            raise HistoryError(f"history {path}:{number}: not a regression-pass entry (no figures)")
        entries.append(found)
    if not entries:
        raise HistoryError(f"history {path}: holds no run")
    return entries


def label(found: dict) -> str:
    """A git SHA shortened to 8 digits, any other name (a tag, `--commit v1.2`) up to 16 characters."""
    commit = str(found.get("commit") or "?")
    commit = commit[:8] if re.fullmatch(r"[0-9a-f]{40}", commit) else commit[:16]
    return commit + ("+" if found.get("dirty") else "")


def trend(entries: list[dict], out: Path) -> list[str]:
    """Draw the trend of every figure of `entries` into `out` (PNG); the names of the figures drawn."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    names = sorted({n for e in entries for n in e["figures"]}, key=lambda n: (not _gated(entries, n), n))
    columns = 2
    rows = math.ceil(len(names) / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6 * columns, 2.6 * rows), squeeze=False)
    labels = [label(e) for e in entries]
    for ax, name in zip(axes.flat, names, strict=False):
        _panel(ax, name, entries, labels)
    for ax in list(axes.flat)[len(names) :]:
        ax.set_visible(False)
    fig.suptitle(f"Regression pass over {len(entries)} runs (value in each run; dashed: baseline and threshold)")
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return names


def _gated(entries: list[dict], name: str) -> bool:
    return any(e["figures"].get(name, {}).get("gated") for e in entries)


def _panel(ax, name: str, entries: list[dict], labels: list[str]) -> None:
    xs, ys, failed, base, limit = [], [], [], [], []
    unit = "s"
    for x, e in enumerate(entries):
        row = e["figures"].get(name)
        if not row or row.get("value") is None:
            continue
        unit = row["unit"]
        xs.append(x)
        ys.append(row["value"])
        failed.append(row["status"] in ("REGRESSED", "MISSING"))
        base.append(row.get("baseline"))
        limit.append(row["baseline"] * e["threshold"] if row.get("baseline") and row.get("gated") else None)
    scale, shown = (1e3, "ms") if unit == "s" else (1.0, unit)
    ax.plot(xs, [y * scale for y in ys], marker="o", color="tab:blue")
    bad = [(x, y * scale) for x, y, f in zip(xs, ys, failed, strict=True) if f]
    if bad:
        ax.scatter(*zip(*bad, strict=True), color="tab:red", zorder=3, label="failed")
    for series, style in ((base, "tab:green"), (limit, "tab:red")):
        points = [(x, v * scale) for x, v in zip(xs, series, strict=True) if v is not None]
        if points:
            ax.plot(*zip(*points, strict=True), linestyle="--", color=style, linewidth=1)
    gated = "" if _gated(entries, name) else " (reference, not gated)"
    ax.set_title(f"{name}{gated}", fontsize=9)
    ax.set_ylabel(shown)
    ax.set_xticks(range(len(labels)), labels, rotation=30, fontsize=7)
    ax.set_ylim(bottom=0)
