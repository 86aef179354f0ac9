"""The sweep's parsing, phases, fit and tables on hand-made runs (no timing asserted); its round sizing and
memory fitting as pure functions, and --device cuda refused at once without a GPU."""

from __future__ import annotations

import os
import sys
from typing import ClassVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ckptspec.bench import sweep
from ckptspec.bench.sides import device_problem
from ckptspec.bench.sweep import (
    PHASES,
    Resources,
    _stand_ins,
    fit,
    fit_point,
    interpolate,
    main,
    parse_peer,
    parser,
    phases_of,
    size_rounds,
    table,
)


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


def test_impls_phase_marks_give_the_median_of_each_marks_first_or_last_time():
    run = _run("size", {64: 1.0})
    saves = []
    for k in range(3):
        save = _save(1.0)
        save["marks"] = {"planned": [0.001 * (k + 1), 0.5], "last byte": [0.2, 0.3 + 0.1 * k]}
        saves.append(save)
    run["points"][0]["peers"]["impl"]["rounds"] = saves
    text = table(run)
    assert "Where impl's time goes" in text
    row = next(line for line in text.splitlines() if line.startswith("| 64 | `impl` | 2 |"))
    assert "| 400 |" in row, row  # last byte: the median of its last occurrences (300, 400, 500 ms)
    assert "Where impl's time goes" not in table(_run("size", {64: 1.0})), "a run without marks has no such table"


def test_each_peers_counted_costs_go_beside_its_growth():
    run = _run("size", {64: 0.1, 256: 0.4})
    run["counted_at"] = 64
    run["counted"] = {"impl": {"fsync": 4.0, "rename": 2.0, "write": 53.0, "files": 2}}
    text = table(run)
    assert "counted per save at 64" in text
    assert "fsync 4, rename 2, write 53, files 2" in text


def test_rounds_fill_the_budget_within_their_bounds():
    # Two points: 10 s and 20 s fixed, 1 s and 3 s a round: 100 s leave 70 s, 17 rounds of 4 s.
    assert size_rounds(100, [10, 20], [1, 3], minimum=3, maximum=20) == 17
    assert size_rounds(100, [10, 20], [1, 3], maximum=5) == 5
    assert size_rounds(30, [10, 20], [1, 3]) == 3, "at least the minimum: the budget then cuts the largest points"
    assert size_rounds(10, [20], [1]) == 3, "a budget the fixed costs already pass"
    assert size_rounds(100, [10], [0.0], maximum=7) == 7


def test_a_cost_between_the_probed_points_is_on_their_line():
    known = {64.0: 2.0, 16384.0: 100.0}
    assert interpolate(64, known) == pytest.approx(2.0)
    assert interpolate(16384, known) == pytest.approx(100.0)
    assert 2.0 < interpolate(1024, known) < interpolate(4096, known) < 100.0
    assert interpolate(4096, {64.0: 5.0}) == 5.0
    assert interpolate(0, {10.0: 1.0, 20.0: 5.0}) == 0.0, "never below 0"


GIB = 1 << 30


def test_a_point_fits_in_groups_of_peers_or_is_left_out_saying_why():
    h200 = Resources(host_available=120 * GIB, disk_free=60 * GIB, gpus=1, gpu_free=139 * GIB)
    assert fit_point({"size_mib": 64, "world": 1}, 8, "cuda", h200) == (8, None)
    assert fit_point({"size_mib": 16384, "world": 1}, 8, "cuda", h200) == (3, None), "32 GiB per peer"
    assert fit_point({"size_mib": 16384, "world": 1}, 8, "cpu", h200) == (2, None), "48 GiB per peer on the CPU"
    fits, why = fit_point({"size_mib": 1024, "world": 2}, 8, "cuda", h200)
    assert (fits, why) == (0, "needs 2 GPUs (one per rank), found 1")
    fits, why = fit_point({"size_mib": 65536, "world": 1}, 8, "cuda", h200)
    assert fits == 0
    assert "free on the scratch disk" in str(why)
    small = Resources(host_available=20 * GIB, disk_free=600 * GIB, gpus=8, gpu_free=80 * GIB)
    fits, why = fit_point({"size_mib": 16384, "world": 1}, 8, "cuda", small)
    assert fits == 0
    assert "host memory" in str(why)


def test_cuda_sides_are_refused_at_once_without_a_gpu(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert "no CUDA device here" in str(device_problem("cuda"))
    assert device_problem("cpu") is None
    out = tmp_path / "run.json"
    status = main(["run", "--axis", "size", "--values", "1", "--peer", "impl", "--device", "cuda", "--out", str(out)])
    assert status == 2
    err = capsys.readouterr().err
    assert "no CUDA device here" in err
    assert "Traceback" not in err
    assert not out.exists()
    # The plan of a GPU run can still be made here (gpu_run's dry run): nothing measured, nothing refused.
    assert parser().parse_args(["run", "--axis", "size", "--values", "1", "--peer", "x", "--out", "o"]).device == "cpu"


def test_a_peers_own_pythonpath_goes_before_the_drivers():
    spec = parse_peer("dcp.save=sync_dcp_adapter:PYTHONPATH=docs/examples,X=1").side()
    assert spec.pythonpath == (os.path.abspath("docs/examples"),)
    assert spec.env == (("X", "1"),)


def test_a_cut_point_a_failed_peer_and_what_was_left_out_are_named():
    run = _run("size", {64: 0.1, 256: 0.4})
    run["settings"]["device"] = "cuda"
    run["machine"]["gpu"] = "GPU X"
    run["points"][1]["cut"] = True
    run["points"][1]["peers"]["impl"]["rounds"] = [_save(0.4)] * 2
    run["points"][1]["peers"]["gone"] = {"rounds": [], "error": "first save: side gone: KeyError\n  | more"}
    run["peers"]["gone"] = {}
    run["left_out"] = [[16384, "a side needs about 32.0 GiB of host memory; 20.0 available"]]
    run["skipped"] = {"nvrx-0.7.0": "TargetUnavailable: no nvidia_resiliency_ext"}
    text = table(run)
    assert "tensors on cuda, GPU X" in text
    assert "`impl` (2 rounds: cut by the budget)" in text
    assert "first save: side gone: KeyError |" in text
    assert "MiB per rank 16384 left out: a side needs about 32.0 GiB" in text
    assert "`nvrx-0.7.0` skipped: TargetUnavailable" in text


def test_a_probed_point_the_budget_left_out_shows_the_first_measurements_round():
    run = _run("size", {64: 0.1})
    probe = _run("size", {16384: 9.0})["points"][0]
    probe["peers"]["impl"]["rounds"] = [_save(9.0)]
    run["probe"] = [dict(run["points"][0]), {**probe, "fixed_s": 30.0, "round_s": 9.0}]
    _stand_ins(run)
    assert [p["value"] for p in run["points"]] == [64, 16384]
    assert run["points"][1]["from_probe"]
    assert "fixed_s" not in run["points"][1]
    assert (
        "`impl` (1 round: the first measurement's; the budget left no more) | 1800 [1800, 1800] | 9000 [9000, 9000]"
        in table(run)
    )


class _FakeSide:
    """A side that answers at once (sweep.measure_point's view of one), failing where its adapter says "broken"."""

    started: ClassVar[list[str]] = []

    def __init__(self, spec, scratch, size_mib, tensors, world=1, device="cpu", wait=True, phases=False):
        self.spec, self.ready, self.saves = spec, {}, 0
        _FakeSide.started.append(spec.label)

    def await_ready(self):
        self.ready = {"version": "0"}
        return self.ready

    def request(self, message):
        self.saves += 1
        if self.spec.impl == "broken" and self.saves > 1:
            raise sweep.GateError(f"side {self.spec.label}: save: KeyError")
        save = {"start": 0.01, "stall": 0.02, "committed": 0.1, "data_last": None, "metadata": None}
        return {**save, "ranks": [save], **({"snapshot": True} if message["verify"] else {})}

    def close(self):
        pass


def test_a_point_runs_its_groups_in_turn_drops_a_failing_peer_and_stops_at_the_deadline(monkeypatch, tmp_path):
    monkeypatch.setattr(sweep, "Side", _FakeSide)
    _FakeSide.started = []
    peers = [parse_peer(p) for p in ("a=impl", "b=impl", "c=broken")]
    point = {"value": 1, "size_mib": 1, "tensors": 1, "world": 1}
    measured = sweep.measure_point(peers, point, 3, tmp_path, group=2)
    assert measured["groups"] == [["a", "b"], ["c"]]
    assert [len(measured["peers"][p]["rounds"]) for p in "ab"] == [3, 3]
    assert measured["peers"]["c"]["error"].startswith("round 1: side c: save: KeyError")
    assert measured["peers"]["a"]["snapshot"]
    assert "cut" not in measured
    late = sweep.measure_point(peers, point, 3, tmp_path, group=2, deadline=sweep.time.monotonic() - 1)
    assert late["cut"]
    assert all(not d["rounds"] for d in late["peers"].values())
    assert _FakeSide.started == ["a", "b", "c"], "no group starts once the deadline has passed"


def test_the_transformer_layout_holds_layers_with_adam_state_of_about_the_bytes_asked(monkeypatch):
    from ckptspec.bench.sides import _side_module

    side = _side_module()  # side.py, loaded by path as the driver loads it
    monkeypatch.setenv(side.LAYOUT_ENV, "transformer")
    state = side._state_dict(4, 3 * side.PER_LAYER, 0)
    model = state["model"]
    assert len(model) == 3 * side.PER_LAYER, "three layers of weights, each with exp_avg and exp_avg_sq"
    assert {"r0.layers.2.mlp.down.weight.exp_avg_sq", "r0.layers.0.attn.qkv.weight"} <= set(model)
    assert 0.8 * 4 * 2**20 <= sum(t.nbytes for t in model.values()) <= 1.2 * 4 * 2**20
    assert {"step", "adam_step", "rng"} <= set(state)
    monkeypatch.delenv(side.LAYOUT_ENV)
    assert len(side._state_dict(4, 7, 0)["model"]) == 7, "the flat layout: the tensors asked"
