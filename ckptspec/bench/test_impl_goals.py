"""impl's goals block (ckptspec/bench/impl_goals.py): each goal read from its stored file, met or not by its own
limit, and "not measured" where the file or the peer is missing."""

from __future__ import annotations

import json

from ckptspec.bench.impl_goals import goal_lines


def _save(stall: float, planned: float | None = None) -> dict:
    save: dict = {"stall": stall, "committed": 2 * stall}
    if planned is not None:
        save["marks"] = {"plan": [0.001, 0.001], "planned": [0.001 + planned, 0.001 + planned]}
    return save


def _sweep(label: str, points: dict[float, list[dict]]) -> dict:
    return {"points": [{"value": v, "peers": {label: {"rounds": r}}} for v, r in points.items()]}


def _write(root, name: str, data: dict) -> None:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def test_each_goal_is_judged_by_its_own_limit(tmp_path):
    paired = {"settings": {"size_mib": 1024}, "paired": {"committed": {"ratio": 0.98, "low": 0.9, "high": 1.06}}}
    _write(tmp_path, "paired/impl-vs-dcp-save.json", paired)
    _write(
        tmp_path,
        "sweeps/tensors-cpu.json",
        _sweep("impl-cached", {16: [_save(0.01, 0.0004)] * 3, 10000: [_save(1, 0.02)] * 3}),
    )
    _write(
        tmp_path,
        "sweeps/size-4g-impl-cpu.json",
        _sweep("impl", {256: [_save(0.05)], 1024: [_save(0.2)], 4096: [_save(0.84)]}),
    )
    _write(tmp_path, "sweeps/ranks-cpu.json", _sweep("impl", {1: [_save(0.1)], 4: [_save(0.105)]}))
    lines = goal_lines(tmp_path)
    assert lines[0].startswith("- [ ]"), "an interval reaching above 1.05x misses the goal even with a median below 1"
    assert lines[1].startswith("- [x]")
    assert "0.4 ms at 16 tensors" in lines[1]
    assert lines[2].startswith("- [ ]")
    assert "20 ms at 10000 tensors" in lines[2]
    assert lines[3].startswith("- [x]")
    assert "5% apart" in lines[3]
    assert lines[4].startswith("- [x]")


def test_a_missing_run_or_peer_is_not_measured(tmp_path):
    _write(tmp_path, "sweeps/tensors-cpu.json", _sweep("impl", {16: [_save(0.01, 0.0004)]}))  # no impl-cached
    assert all("not measured" in line and line.startswith("- [ ]") for line in goal_lines(tmp_path))


def test_a_goal_line_says_where_the_time_goes_when_the_saves_carry_their_marks(tmp_path):
    """The planning line splits planning into its steps (impl's marks fingerprinted, buckets, agreed); the stall
    line gives the copy's share per GiB (marks copies to snapshot); a save without those marks gives no split."""
    steps = {"plan": 0.0, "fingerprinted": 0.009, "buckets": 0.012, "agreed": 0.0125, "planned": 0.015}
    prepared = {"stall": 0.2, "committed": 1.0, "marks": {k: [v, v] for k, v in steps.items()}}
    _write(tmp_path, "sweeps/tensors-cpu.json", _sweep("impl-cached", {10000: [prepared] * 3, 16: [_save(0.01, 4e-4)]}))
    copy = {"copies": [0.001, 0.001], "snapshot": [0.101, 0.101]}
    sizes: dict[float, list[dict]] = {
        v: [{"stall": 0.11 * v / 1024, "marks": {k: [t * v / 1024 for t in c] for k, c in copy.items()}}]
        for v in (256, 1024)
    }
    _write(tmp_path, "sweeps/size-4g-impl-cpu.json", _sweep("impl", sizes))
    lines = goal_lines(tmp_path)
    assert "the steps (median ms): fingerprint 9, buckets 3, agreement 0.5, the rest 2.5" in lines[2]
    assert "the steps" not in lines[1], "a save without the planning steps' marks has no split"
    assert "of it the copy (marks `copies` to `snapshot`) 100, 100 ms per GiB" in lines[3]


def test_the_ranks_goal_is_judged_on_the_machine_with_the_most_cores(tmp_path):
    two = {**_sweep("impl", {1: [_save(0.03)], 4: [_save(0.1)]}), "machine": {"cores": 2}}
    sixteen = {**_sweep("impl", {1: [_save(0.03)], 4: [_save(0.032)]}), "machine": {"cores": 16}}
    _write(tmp_path, "sweeps/ranks-cpu.json", two)
    _write(tmp_path, "sweeps/ranks-cpu-h200-host.json", sixteen)
    line = goal_lines(tmp_path)[4]
    assert line.startswith("- [x]"), line
    assert "(16 cores)" in line, line
