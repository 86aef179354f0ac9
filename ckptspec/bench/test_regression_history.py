"""The regression pass's history (JSON lines) and trend picture, from hand-written runs (no timing)."""

from __future__ import annotations

import json

import pytest

from ckptspec.bench.regression import __main__ as cli
from ckptspec.bench.regression.history import HistoryError, label, read
from ckptspec.bench.regression_runs import TIMES, make_run, unusable, write_baseline, written

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _three_runs(tmp_path, capsys) -> tuple:
    """Three compared runs appended to a history: as the baseline, the stall 2x, the stall 4x (fails)."""
    baseline, history = write_baseline(tmp_path / "b.json"), tmp_path / "hist" / "runs.jsonl"
    statuses = []
    for i, stall in enumerate((0.008, 0.016, 0.032)):
        run = tmp_path / f"run-{i}.json"
        run.write_text(json.dumps(make_run(commit=f"{i}" * 40, test_stall_dcp_impl_=stall)))
        statuses.append(cli.main(["compare", str(baseline), "--run", str(run), "--history", str(history)]))
    capsys.readouterr()
    return history, statuses


def test_each_compare_appends_one_line_with_its_figures_and_verdict(tmp_path, capsys):
    history, statuses = _three_runs(tmp_path, capsys)
    assert statuses == [0, 0, 1]
    entries = read(history)
    assert [e["commit"] for e in entries] == ["0" * 40, "1" * 40, "2" * 40]
    assert [e["passed"] for e in entries] == [True, True, False]
    stall = [e["figures"]["test_stall[dcp:impl]"] for e in entries]
    assert [s["ratio"] for s in stall] == pytest.approx([1.0, 2.0, 4.0])
    assert stall[0]["unit"] == "x memcpy"
    assert stall[2]["status"] == "REGRESSED"
    assert all(set(e["figures"]) == set(TIMES) and e["threshold"] == 3.0 for e in entries)


def test_the_commit_option_names_the_run_in_the_history(tmp_path, capsys):
    baseline, history, run = write_baseline(tmp_path / "b.json"), tmp_path / "h.jsonl", tmp_path / "r.json"
    run.write_text(json.dumps(make_run()))
    assert cli.main(["compare", str(baseline), "--run", str(run), "--history", str(history), "--commit", "abc"]) == 0
    assert read(history)[0]["commit"] == "abc"
    capsys.readouterr()


def test_trend_draws_every_figure_of_three_runs(tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the trend picture needs matplotlib (extra `bench`)")
    history, _ = _three_runs(tmp_path, capsys)
    out = tmp_path / "pictures" / "trend.png"
    assert cli.main(["trend", str(history), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(PNG_SIGNATURE)
    assert out.stat().st_size > 10_000
    assert capsys.readouterr().out.strip().endswith(f"trend of {len(TIMES)} figures over 3 runs written to {out}")


@pytest.mark.parametrize(
    ("content", "reason"),
    [(None, "cannot read it"), ("", "holds no run"), ("{oops\n", "not JSON"), ('{"time": 1}\n', "no figures")],
)
def test_an_unusable_history_is_one_line_and_exit_status_2(tmp_path, capsys, content, reason):
    path = written(tmp_path / "runs.jsonl", content)
    with pytest.raises(HistoryError, match=reason):
        read(path)
    assert reason in unusable(capsys, ["trend", str(path), "--out", str(tmp_path / "t.png")])
    assert not (tmp_path / "t.png").exists()


def test_a_run_is_labelled_by_its_short_sha_or_its_name():
    assert label({"commit": "0123456789abcdef" * 2 + "01234567", "dirty": True}) == "01234567+"
    assert label({"commit": "v1.2-rc1-with-a-long-name"}) == "v1.2-rc1-with-a-"
    assert label({}) == "?"
