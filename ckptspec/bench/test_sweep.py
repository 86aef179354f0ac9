"""The sweep's parsing, phases, fit and tables on hand-made runs (no timing asserted)."""

from __future__ import annotations

import os
import sys

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptspec.bench.sweep import PHASES, fit, parse_peer, phases_of, table


def test_a_peer_names_its_label_adapter_interpreter_and_variables():
    peer = parse_peer("fast=impl@/usr/bin/python3:CKPTSPEC_IMPL_STAGING=overlapped,PYTHONPATH=docs/examples")
    assert (peer.label, peer.adapter, peer.python) == ("fast", "impl", "/usr/bin/python3")
    assert dict(peer.env) == {"CKPTSPEC_IMPL_STAGING": "overlapped", "PYTHONPATH": os.path.abspath("docs/examples")}
    plain = parse_peer("impl")
    assert (plain.label, plain.python, plain.env) == ("impl", sys.executable, ())
    with pytest.raises(ValueError, match="not NAME=VALUE"):
        parse_peer("impl:OOPS")
    with pytest.raises(ValueError, match="no adapter"):
        parse_peer("label=")


@given(st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1), st.floats(0, 1))
def test_phases_are_never_negative_and_add_up_to_time_to_committed(a, b, c, d, e):
    start, stall, committed = sorted([a, b, c])
    save = {"start": start, "stall": stall, "committed": committed, "data_last": d, "metadata": e}
    phases = phases_of(save)
    assert list(phases) == list(PHASES)
    assert all(v >= 0 for v in phases.values())
    assert sum(phases.values()) == pytest.approx(committed)


def test_a_line_is_fitted_exactly():
    fixed, slope = fit([64, 256, 1024], [0.1 + 0.002 * x for x in (64, 256, 1024)])
    assert fixed == pytest.approx(0.1)
    assert slope == pytest.approx(0.002)


def _save(seconds: float, others: list[float] | None = None) -> dict:
    rank0 = {"start": 0.1 * seconds, "stall": 0.2 * seconds, "committed": seconds, "data_last": None}
    return {**rank0, "ranks": [rank0, *({"committed": o} for o in (others or []))]}


def _run(axis: str, points: dict[float, float]) -> dict:
    return {
        "axis": axis,
        "settings": {"size": 64, "tensors": 16, "ranks": 1, "rounds": 3},
        "machine": {"datetime": "2026-11-28T00:00:00Z", "cores": 2, "memory_gib": 24},
        "load": {"start": [1.0], "end": [1.0]},
        "peers": {"impl": {}},
        "points": [
            {"value": v, "peers": {"impl": {"first": _save(9 * t), "rounds": [_save(t)] * 3, "snapshot": True}}}
            for v, t in points.items()
        ],
    }


def test_the_table_names_growth_per_unit_and_flags_super_linear_steps():
    linear = table(_run("size", {256: 0.25, 1024: 1.0}))
    assert "1000 ms per GiB" in linear
    assert "super-linear" not in linear
    quadratic = table(_run("tensors", {1000: 0.1, 10000: 10.0}))
    assert "**super-linear**" in quadratic


def test_other_ranks_wait_is_their_slowest_and_a_wrong_snapshot_shows():
    run = _run("ranks", {1: 1.0})
    run["points"][0]["peers"]["impl"]["rounds"] = [_save(1.0, [0.5, 0.8])] * 3
    run["points"][0]["peers"]["impl"]["snapshot"] = False
    text = table(run)
    assert "| 800 |" in text
    assert "**NO**" in text


def test_each_peers_counted_costs_go_beside_its_growth():
    run = _run("size", {64: 0.1, 256: 0.4})
    run["counted_at"] = 64
    run["counted"] = {"impl": {"fsync": 4.0, "rename": 2.0, "write": 53.0, "files": 2}}
    text = table(run)
    assert "counted per save at 64" in text
    assert "fsync 4, rename 2, write 53, files 2" in text
