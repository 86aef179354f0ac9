"""What changed between two judged releases of one target: what the newer one fixed, what it newly breaks, what it
still breaks.

A release's findings page opens its verdicts with this section when a run of an older release of the same target
is stored beside it (NVRx 0.4.1 -> 0.7.0, Megatron-Core 0.16.1 -> 0.19.2, torch 2.13 -> 2.15 for each DCP
configuration). "Missed" here is any verdict that names a missed clause: a documented or implied break, a decision
of this spec the release does not meet, the weak level only, or an intermittent failure (seen on some runs). A clause judged on one release only (a test or a
capability one of them lacks) is left out: there is nothing to compare.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from itertools import pairwise
from typing import Any

from packaging.version import InvalidVersion, Version

from ckptspec.report import verdicts
from ckptspec.report.runs import Run

__all__ = ["predecessors", "section"]

Judge = Callable[[Run, str, Mapping[str, Mapping[str, Any]]], verdicts.Verdict]


def _target_and_version(run: Run) -> tuple[str, Version] | None:
    target, _, version = run.label.partition(" ")
    try:
        return target, Version(version)
    except InvalidVersion:
        return None  # impl's "(source tree)": no release order


def predecessors(runs: Sequence[Run]) -> dict[str, Run]:
    """For each run's label, the run of the same target's next older release among `runs`, where there is one."""
    ordered: dict[str, list[tuple[Version, Run]]] = {}
    for run in runs:
        parsed = _target_and_version(run)
        if parsed is not None:
            ordered.setdefault(parsed[0], []).append((parsed[1], run))
    found: dict[str, Run] = {}
    for releases in ordered.values():
        releases.sort(key=lambda pair: pair[0])
        for (_, older), (_, newer) in pairwise(releases):
            found[newer.label] = older
    return found


def section(older: Run, newer: Run, registry: Mapping[str, Mapping[str, Any]], judge: Judge) -> list[str]:
    """The Markdown lines of the section: fixed, new and unchanged misses, each clause with both verdicts."""
    fixed, new, still = [], [], []
    for cid in registry:
        before, after = judge(older, cid, registry), judge(newer, cid, registry)
        if before.word == verdicts.PASSES and not before.missed and after.missed:
            new.append(f"{cid} ({after})")
        elif before.missed and after.word == verdicts.PASSES and not after.missed:
            fixed.append(f"{cid} (was: {before})")
        elif before.missed and after.missed:
            still.append(cid if before.word == after.word else f"{cid} ({before.word} -> {after.word})")
    lines = [f"## Changed since {older.label}", ""]
    for title, items in (("Newly missed", new), ("Fixed", fixed), ("Missed by both", still)):
        lines.append(f"- **{title}** ({len(items)}): " + (", ".join(items) if items else "none") + ".")
    return [*lines, ""]
