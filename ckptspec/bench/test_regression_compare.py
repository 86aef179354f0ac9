"""The regression pass's figures, baseline and verdict, on hand-written runs (ordinary tests, no timing)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest

from ckptspec.bench.regression import __main__ as cli
from ckptspec.bench.regression.baseline import BaselineError, best_of, load, scaled
from ckptspec.bench.regression.compare import THRESHOLD_ENV, compare, threshold_from
from ckptspec.bench.regression.measure import Settings, figures_of
from ckptspec.bench.regression_runs import TIMES, make_run, unusable, write_baseline, written

STORED = Path(__file__).parent / "baseline" / "cpu-2core.json"
GATED = 5


def test_each_figure_is_divided_by_its_reference_of_the_same_run():
    figures = figures_of(make_run())
    assert figures["test_stall[dcp:impl]"].reference == "test_memcpy"
    assert figures["test_load[dcp:impl]"].reference == "test_memcpy"
    assert figures["test_time_to_durable[dcp:impl]"].reference == "test_write_fsync"
    assert figures["test_write[dcp:impl@durable]"].reference == "test_write_fsync"
    assert figures["test_goodput_regression[dcp:impl]"].reference == "test_goodput_regression[none]"
    assert sorted(n for n, f in figures.items() if not f.gated) == [
        "test_goodput_regression[none]",
        "test_memcpy",
        "test_write_fsync",
    ]


def test_baseline_keeps_each_figures_best_and_its_source():
    made = best_of([make_run(test_stall_dcp_impl_=0.012), make_run(test_stall_dcp_impl_=0.009)], Settings(rounds=3))
    stall = made.data["figures"]["test_stall[dcp:impl]"]
    assert stall["seconds"] == 0.009
    assert stall["per_run"] == [0.012, 0.009]
    assert made.data["runs"] == 2
    assert made.settings.rounds == 3
    source = made.data["source"]
    assert (source["python"], source["torch"], source["commit"]) == ("CPython 3.12.1", "2.13.0", "c0ffee")
    assert "Test CPU" in source["machine"]


def test_same_figures_pass_and_a_slower_stall_fails():
    base = best_of([make_run()], Settings())
    rows = {r.name: r for r in compare(base, figures_of(make_run()), 3.0)}
    assert all(r.status == "ok" for r in rows.values() if r.gated)
    assert len(rows) == len(TIMES)
    rows = {r.name: r for r in compare(base, figures_of(make_run(test_stall_dcp_impl_=0.032)), 3.0)}
    assert rows["test_stall[dcp:impl]"].status == "REGRESSED"
    assert rows["test_stall[dcp:impl]"].ratio == pytest.approx(4.0)
    assert [n for n, r in rows.items() if r.failed] == ["test_stall[dcp:impl]"]


def test_a_uniformly_slower_runner_does_not_fail_and_ceilings_are_never_gated():
    base = best_of([make_run()], Settings())
    rows = compare(base, figures_of(make_run(factor=10.0)), 3.0)
    assert not any(r.failed for r in rows)
    ceilings = [r for r in rows if not r.gated]
    assert len(ceilings) == 3
    assert all(r.ratio == pytest.approx(10.0) and r.status == "reference" for r in ceilings)


def test_a_figure_missing_from_the_run_fails_and_a_missing_reference_compares_absolute_times():
    base = best_of([make_run()], Settings())
    run = make_run(test_memcpy=0.002)
    run["benchmarks"] = [b for b in run["benchmarks"] if b["name"] not in ("test_load[dcp:impl]", "test_memcpy")]
    rows = {r.name: r for r in compare(base, figures_of(run), 3.0)}
    assert rows["test_load[dcp:impl]"].status == "MISSING"
    assert rows["test_load[dcp:impl]"].failed
    stall = rows["test_stall[dcp:impl]"]
    assert (stall.unit, stall.ratio, stall.failed) == ("s", pytest.approx(1.0), False)
    assert rows["test_memcpy"].status == "reference"
    assert not rows["test_memcpy"].failed


def test_threshold_comes_from_the_option_then_the_environment(monkeypatch):
    monkeypatch.delenv(THRESHOLD_ENV, raising=False)
    assert threshold_from(None) == 3.0
    monkeypatch.setenv(THRESHOLD_ENV, "5")
    assert threshold_from(None) == 5.0
    assert threshold_from("2.5x") == 2.5
    for bad in ("fast", "1", "0.5"):
        with pytest.raises(ValueError, match="threshold"):
            threshold_from(bad)


@pytest.mark.parametrize(
    ("content", "reason"),
    [(None, "cannot read it"), ("{not json", "not JSON"), ('{"format": "other"}', "not a ckptspec-regression")],
)
def test_an_unusable_baseline_is_one_line_and_exit_status_2(tmp_path, capsys, content, reason):
    path = written(tmp_path / "baseline.json", content)
    with pytest.raises(BaselineError, match=reason):
        load(path)
    err = unusable(capsys, ["compare", str(path), "--run", str(path)])
    assert reason in err
    assert "record" in err


def test_a_bad_threshold_is_one_line_and_exit_status_2(tmp_path, capsys):
    baseline = write_baseline(tmp_path / "b.json")
    assert "not a number" in unusable(capsys, ["compare", str(baseline), "--threshold", "fast", "--run", str(baseline)])


def test_compare_against_a_ten_times_faster_baseline_fails_with_one_line_per_figure(tmp_path, capsys):
    baseline, run = write_baseline(tmp_path / "b.json"), tmp_path / "run.json"
    run.write_text(json.dumps(make_run()))
    assert cli.main(["compare", str(baseline), "--run", str(run)]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith(f"{cli.PROG}: PASS: {GATED} gated figures within 3x")

    fast = tmp_path / "fast.json"
    assert cli.main(["scale", str(baseline), "0.1", "--out", str(fast)]) == 0
    assert cli.main(["compare", str(fast), "--run", str(run)]) == 1
    out = capsys.readouterr().out.splitlines()
    regressed = [line for line in out if line.startswith("REGRESSED ")]
    assert len(regressed) == GATED
    assert all("10.00x > 3x" in line for line in regressed)
    assert out[-1].startswith(f"{cli.PROG}: FAIL: {GATED} of {GATED} gated figures beyond 3x")


def test_compare_notes_a_baseline_from_another_python(tmp_path, capsys):
    baseline, run = write_baseline(tmp_path / "b.json"), tmp_path / "run.json"
    other = make_run()
    other["machine_info"]["python_version"] = "3.13.0"
    run.write_text(json.dumps(other))
    assert cli.main(["compare", str(baseline), "--run", str(run)]) == 0
    notes = [line for line in capsys.readouterr().out.splitlines() if line.startswith("note: ")]
    assert notes == ["note: the baseline's python is CPython 3.12.1, this run's CPython 3.13.0"]


def test_the_threshold_option_loosens_the_gate(tmp_path, capsys):
    baseline, run = write_baseline(tmp_path / "b.json"), tmp_path / "run.json"
    run.write_text(json.dumps(make_run(test_stall_dcp_impl_=0.032)))  # 4x the baseline's stall
    assert cli.main(["compare", str(baseline), "--run", str(run)]) == 1
    assert cli.main(["compare", str(baseline), "--run", str(run), "--threshold", "5"]) == 0
    capsys.readouterr()


def test_scaling_keeps_references():
    fast = scaled(best_of([make_run()], Settings()), 0.1)
    assert fast.figures["test_memcpy"].seconds == 0.001
    assert fast.figures["test_stall[dcp:impl]"].seconds == pytest.approx(0.0008)


def test_stored_baseline_runs_ci_settings_and_gates_the_whole_regression_set():
    stored = load(STORED)
    assert stored.settings == Settings(size_mib=8, rounds=7, threads=1, pytest_args=[])
    assert sorted(stored.figures) == sorted(TIMES)
    assert {n: f.reference for n, f in stored.figures.items()} == {
        n: f.reference for n, f in figures_of(make_run()).items()
    }
    assert stored.data["runs"] >= 3
    assert stored.data["source"]["commit"]


def _fake_runs(monkeypatch, runs: Sequence[dict | None]) -> list:
    """Replace the regression set by `runs`, one per call (None: pytest failed); the settings it was given."""
    given, queue = [], list(runs)

    def run_set(settings, json_path):
        given.append(settings)
        run = queue.pop(0)
        if run is None:
            return 1
        json_path.write_text(json.dumps(run))
        return 0

    monkeypatch.setattr(cli, "run_set", run_set)
    return given


def test_record_keeps_the_best_of_n_runs_and_compare_reruns_with_its_settings(tmp_path, capsys, monkeypatch):
    given = _fake_runs(monkeypatch, [make_run(test_stall_dcp_impl_=s) for s in (0.012, 0.009, 0.010)] + [make_run()])
    out = tmp_path / "base" / "b.json"
    assert cli.main(["record", "--runs", "3", "--rounds", "4", "--out", str(out), "--", "-k", "impl"]) == 0
    text = capsys.readouterr().out
    assert "test_stall[dcp:impl]: 1.33x (x memcpy)" in text
    assert f"baseline written to {out}" in text
    assert load(out).figures["test_stall[dcp:impl]"].seconds == 0.009
    assert cli.main(["compare", str(out)]) == 0
    assert given[-1] == Settings(rounds=4, pytest_args=["-k", "impl"])
    assert len(given) == 4


def test_a_failing_regression_set_fails_record_and_compare(tmp_path, capsys, monkeypatch):
    _fake_runs(monkeypatch, [make_run(), None, None])
    out = tmp_path / "b.json"
    assert cli.main(["record", "--runs", "2", "--out", str(out)]) == 1
    assert "run 2 of the regression set failed" in capsys.readouterr().err
    assert not out.exists()
    assert cli.main(["compare", str(write_baseline(out))]) == 1
    assert "the regression set itself failed" in capsys.readouterr().err
