"""The paired gate on real savers: counted costs are exact, so one extra fsync per save is flagged every time,
naming the counter, while every other count of the same saver is equal on both sides (no timing asserted)."""

from __future__ import annotations

import json
import shutil
import sys

import pytest

from ckptspec.bench.regression import __main__ as cli


@pytest.mark.skipif(shutil.which("strace") is None, reason="counted costs are read with strace, not installed here")
def test_an_extra_fsync_per_save_is_flagged_and_the_same_saver_counts_the_same(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("CKPTSPEC_EXTRA_FSYNCS", "1")  # read by the slowed adapter only: the baseline is plain impl
    out = tmp_path / "result.json"
    argv = ["compare", "--against", sys.executable, "--baseline-impl", "impl", "--pairs", "2"]
    argv += ["--size-mib", "1", "--tensors", "4", "--json-out", str(out)]
    status = cli.main([*argv, "--impl", "ckptspec.bench.slowed_adapter"])
    printed = capsys.readouterr().out
    assert status == 1, printed
    counted = json.loads(out.read_text())["counted"]
    assert counted["B"]["fsync"] == counted["A"]["fsync"] + 1
    assert {k: v for k, v in counted["B"].items() if k != "fsync"} == {
        k: v for k, v in counted["A"].items() if k != "fsync"
    }
    assert "counted: fsync +1 (REGRESSED)" in printed
    assert all(json.loads(out.read_text())["snapshot"].values())
