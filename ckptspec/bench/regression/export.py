"""The regression pass's verdict in the forms CI tools read: github-action-benchmark's JSON and a job summary.

- `action_benchmark(rows)`: the `customSmallerIsBetter` input of github-action-benchmark
  (https://github.com/benchmark-action/github-action-benchmark): one entry per gated figure of the run, its value
  as the gate compares it (normalised by its reference measured in the same run: "x memcpy", "x none"; seconds
  where the run lacks the reference), so the history it keeps is the gate's own figures, commit by commit.
- `summary(rows, threshold, verdict, peer)`: Markdown for $GITHUB_STEP_SUMMARY: the verdict line, then each figure
  with this run's value, the baseline's, the ratio and its status.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ckptspec.bench.figures import md_table
from ckptspec.bench.regression.compare import Row

__all__ = ["action_benchmark", "summary"]


def action_benchmark(rows: Sequence[Row]) -> list[dict[str, Any]]:
    """github-action-benchmark's customSmallerIsBetter entries of the gated figures this run measured."""
    return [
        {
            "name": row.name,
            "unit": row.unit,
            "value": row.value,
            "extra": (
                f"{row.ratio:.3f}x the baseline ({row.status})" if row.ratio is not None else "not in the baseline"
            ),
        }
        for row in rows
        if row.gated and row.value is not None
    ]


def _cell(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value * 1e3:.3g} ms" if unit == "s" else f"{value:.3g} {unit}"


def summary(rows: Sequence[Row], threshold: float, verdict: str, peer: str | None = None) -> str:
    """The job summary's Markdown of one comparison."""
    mark = "red" if verdict.startswith("FAIL") else "green"
    head = f"## ckptspec cost gate{f': `{peer}`' if peer else ''}"
    table = md_table(
        ["figure", "this run", "baseline", "ratio", "verdict"],
        [
            [
                f"`{r.name}`",
                _cell(r.value, r.unit),
                _cell(r.baseline, r.unit),
                "-" if r.ratio is None else f"{r.ratio:.2f}x",
                r.status if r.gated or r.status != "reference" else "reference (not gated)",
            ]
            for r in rows
        ],
    )
    lines = [head, "", f"**{mark}** ({threshold:g}x gate): {verdict}", "", *table, ""]
    return "\n".join(lines) + "\n"
