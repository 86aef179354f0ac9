"""The goodput table, goals and pictures, on a hand-written run (ordinary tests, not benchmarks)."""

from __future__ import annotations

import pytest

from ckptspec.bench import goodput_plot, goodput_summary, summary
from ckptspec.bench.figures import BenchmarkRun

MiB = 1 << 20


def _row(peer, interval, wall_s, *, step_s=0.1, steps=10, busy=(), saves=(), wrong=None, peak=MiB):
    """A goodput benchmark of `steps` steps of `step_s` each; `busy` steps (1-based) had a save in flight
    and took twice as long; `saves` are (step, call_s, wait_s, durable_s)."""
    extra = {
        "figure": "goodput",
        "peer": peer,
        "interval": interval,
        "bytes": 8 * MiB,
        "device": "cpu",
        "family": None if peer == "none" else peer.split(":")[0],
        "steps": steps,
        "wall_s": wall_s,
        "step_s": [step_s * (2 if i + 1 in busy else 1) for i in range(steps)],
        "in_flight": [int(i + 1 in busy) for i in range(steps)],
        "saves": [{"step": s, "call_s": c, "wait_s": w, "durable_s": d} for s, c, w, d in saves],
        "final_wait_s": 0.0,
        "standing_bytes": 0,
        "peak_extra_bytes": peak,
        "wrong_snapshots": wrong or {},
        "load_average": [1.0, 1.5],
    }
    return {
        "name": f"test_goodput[{peer}]",
        "stats": {"median": wall_s, "min": wall_s, "rounds": 1},
        "extra_info": extra,
    }


RUN = {
    "datetime": "2026-01-02T03:04:05",
    "machine_info": {"ckptspec": {"cores": 2, "gpu": None, "torch": "2.13.0", "size_mib": 8, "threads": 1}},
    "benchmarks": [
        _row("none", 5, 1.0),
        _row("none", 10, 1.02),  # 2% noise between the baseline runs
        _row("dcp:impl", 5, 1.10, busy=(6, 7), saves=[(5, 0.02, 0.0, 0.15)], peak=8 * MiB),
        _row("dcp:impl", 10, 1.025, saves=[(5, 0.02, 0.0, 0.15)]),
        _row("dcp:save", 5, 1.30, saves=[(5, 0.3, 0.0, 0.3)]),
        _row("dcp:save", 10, 1.20, saves=[(5, 0.3, 0.0, 0.3)]),
        # The fastest, and wrong: it must not win.
        _row("dcp:nvrx", 5, 1.01, saves=[(5, 0.001, 0.0, 0.1)], wrong={"5": ["model/0.weight"]}),
        _row("dcp:nvrx", 10, 1.01, saves=[(5, 0.001, 0.0, 0.1)]),
    ],
}


def test_slowdown_is_paired_within_the_run_and_wall_time_against_the_baseline():
    found = goodput_summary.figures(BenchmarkRun(RUN))
    impl = found["dcp:impl", 5]
    assert impl.step_s == pytest.approx(0.1)  # the median of the steps without a save in flight
    assert impl.overhead_s == pytest.approx(0.02 + 2 * 0.1)  # the stall, and two steps that took twice as long
    assert impl.slowdown == pytest.approx(0.22)
    assert impl.goodput == pytest.approx(1 / 1.22)
    assert impl.interference == pytest.approx(1.0)
    assert impl.wall_vs_base == pytest.approx(0.10)
    assert found["dcp:impl", 10].slowdown == pytest.approx(0.02)
    assert found["dcp:impl", 10].wall_vs_base == pytest.approx(1.025 / 1.02 - 1)


def test_a_wrong_snapshot_is_marked_and_never_ranked():
    table = "\n".join(goodput_summary.render(BenchmarkRun(RUN)))
    assert "| `dcp:impl` | correct (1) | +22.0% | 0.820 | +10.0% | +0.0% | 1 | 20 ms (0.20) | 0 ms (0.00) |" in table
    assert "| `dcp:nvrx` | **wrong snapshot** (1 of 1, CPU tensors) | +0.1% |" in table
    assert table.index("`dcp:save`") < table.index("`dcp:nvrx`")  # the wrong one last, below slower peers
    assert "| 1.0 MiB (0.12x) | - |" in table  # nvrx: no rank
    assert "| `dcp:nvrx` | correct (1), WRONG at another interval | +0.1% |" in table


def test_goals_compare_impl_with_the_correct_peers_only():
    goals = goodput_summary.goals(BenchmarkRun(RUN))
    assert goals[0].startswith("- [x] impl has the lowest slowdown of the peers with correct snapshots")
    assert "every 5: `dcp:impl` +22.0% vs `dcp:save` +30.0%" in goals[0]
    assert "every 10: `dcp:impl` +2.0% vs `dcp:save` +30.0%" in goals[0]  # nvrx, correct here, is still out
    assert goals[1] == "- [ ] impl slowdown under 1% every 10 steps: `dcp:impl` +2.0%"


def test_a_goodput_run_gets_its_own_compact_table():
    text = summary.render_compact(RUN)
    assert text.startswith("#### Goodput: CPU, 2 cores")
    assert (
        "| `dcp:impl` | correct (2) | +22.0% / +2.0% | 0.820 / 0.980 | 0.20 | - | +100.0% | +100.0% / - | 1.50 | 1.00x | 1 |"
        in text
    )
    assert "| `dcp:nvrx` | **wrong snapshot** (1 of 2, CPU tensors) |" in text
    assert "Noise: the 2 baseline runs differ by 2.0%" in text
    assert "Goals for impl" in text
    assert "stall <= " not in text  # no save goals for a goodput-only run


def test_the_pictures_are_written_next_to_the_json(tmp_path):
    pytest.importorskip("matplotlib")
    json_path = tmp_path / "cpu-goodput.json"
    written = goodput_plot.write(RUN, json_path)
    assert written == [tmp_path / "cpu-goodput-steps.png", tmp_path / "cpu-goodput-interval.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in written)
