"""The paired gate: its statistics and verdicts on hand-made rounds (no timing asserted); the real comparison's
counted costs are pinned in harness_tests/test_paired_gate_counts.py (it starts four processes)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from ckptspec.bench.paired import Paired, abba_order, compare_paired, median_ratio, paired_ratios
from ckptspec.bench.regression import __main__ as cli
from ckptspec.bench.regression.paired_gate import PairedResult, rows, verdict
from ckptspec.bench.sides import SIDE, per_request

rounds = st.lists(st.floats(1e-4, 10.0), min_size=2, max_size=40)


def test_pairs_alternate_their_order():
    assert abba_order(4) == [("A", "B"), ("B", "A"), ("A", "B"), ("B", "A")]
    with pytest.raises(ValueError, match="at least 1 pair"):
        abba_order(0)


@given(rounds, st.floats(0.25, 4.0))
@example([1.0, 2.0, 3.0], 1.2)
def test_a_change_by_a_constant_factor_is_that_factor_with_a_point_interval(a, factor):
    p = compare_paired(a, [x * factor for x in a])
    assert p.ratio == pytest.approx(factor)
    assert p.low == pytest.approx(factor)
    assert p.high == pytest.approx(factor)


@given(rounds, rounds)
def test_the_interval_holds_the_median_and_lies_within_the_ratios(a, b):
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    p = compare_paired(a, b)
    ratios = paired_ratios(a, b)
    assert min(ratios) <= p.low <= p.ratio <= p.high <= max(ratios)
    assert compare_paired(a, b) == p  # a fixed seed: the same rounds, the same interval


def test_the_runner_slowing_down_during_the_run_cancels_in_pairs():
    drift = [1.0 + 0.2 * i for i in range(20)]  # each pair runs 20% slower than the one before
    p = compare_paired(drift, [1.2 * x for x in drift])
    assert p.above(1.1)
    assert p.ratio == pytest.approx(1.2)
    unpaired = sorted(drift)[:10]
    assert median_ratio(unpaired, [1.2 * x for x in drift[10:]]) > 2  # comparing unpaired halves would mislead


def test_bad_rounds_are_refused():
    with pytest.raises(ValueError, match="differ in number"):
        paired_ratios([1.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="took no time"):
        paired_ratios([0.0], [1.0])
    with pytest.raises(ValueError, match="level"):
        compare_paired([1.0], [1.0], level=1.0)


def _result(stall_a, stall_b, counted_b=None, snapshot_b=True) -> PairedResult:
    a = {"stall": stall_a, "committed": [3 * x for x in stall_a]}
    b = {"stall": stall_b, "committed": [3 * x for x in stall_b]}
    counted = {"fsync": 4.0, "bytes": 100.0}
    return PairedResult(
        baseline={"impl": "impl", "python": sys.executable},
        current={"impl": "impl", "python": sys.executable},
        settings={"pairs": len(stall_a), "size_mib": 8, "tensors": 16},
        first={"A": {"stall": 1.0, "committed": 2.0}, "B": {"stall": 1.0, "committed": 2.0}},
        rounds={"A": a, "B": b},
        paired={f: compare_paired(a[f], b[f]) for f in ("stall", "committed")},
        snapshot={"A": True, "B": snapshot_b},
        counted={"A": counted, "B": counted_b or counted},
        load={"start": [0.0, 0.0, 0.0], "end": [0.0, 0.0, 0.0]},
    )


def test_a_whole_interval_above_the_threshold_fails_and_noise_about_one_passes():
    noisy = [0.010, 0.012, 0.009, 0.011, 0.010, 0.013]
    passed, line = verdict(_result(noisy, [0.011, 0.010, 0.010, 0.012, 0.009, 0.012]), 1.1)
    assert passed, line
    passed, line = verdict(_result(noisy, [1.25 * x for x in noisy]), 1.1)
    assert not passed
    assert "stall 1.250x" in line
    assert "REGRESSED" in line


def test_one_more_counted_cost_fails_naming_it_and_a_wrong_snapshot_fails_however_fast():
    same = [0.01] * 4
    passed, line = verdict(_result(same, same, counted_b={"fsync": 5.0, "bytes": 100.0}), 1.1)
    assert not passed
    assert "counted: fsync +1" in line
    passed, line = verdict(_result(same, [0.001] * 4, snapshot_b=False), 1.1)
    assert not passed
    assert "snapshot (current)" in line
    assert [r.status for r in rows(_result(same, [0.001] * 4), 1.1) if r.figure == "stall"] == ["faster"]


def test_a_trace_is_split_at_the_marks_and_a_resumed_call_counts_once():
    trace = """100 access("/ckptspec-side-mark-0", F_OK) = -1 ENOENT (No such file or directory)
101 write(5, "abc", 3 <unfinished ...>
100 fsync(7) = 0
101 <... write resumed>) = 3
101 +++ exited with 0 +++
100 access("/ckptspec-side-mark-1", F_OK) = -1 ENOENT (No such file or directory)
100 renameat2(AT_FDCWD, "a", AT_FDCWD, "b", 0) = 0
"""
    assert per_request(trace) == [{"write": 1, "fsync": 1}, {"renameat2": 1}]


def test_a_ref_that_is_no_commit_or_interpreter_is_one_clear_error(tmp_path, capsys):
    status = cli.main(["compare", "--against", "no-such-ref-xyz", "--pairs", "2", "--no-count"])
    assert status == 1
    assert "neither an executable nor a commit" in capsys.readouterr().err
    assert cli.main(["compare", "--against", sys.executable, "--pairs", "1"]) == 2
    assert cli.main(["compare"]) == 2


def test_the_side_is_a_file_that_imports_nothing_of_the_driver():
    source = Path(SIDE).read_text()
    assert "ckptspec.bench" not in source.replace("ckptspec/bench", "")
    assert Paired(1.0, 0.9, 1.1, 3).text() == "1.000x [0.900, 1.100]"


def test_cuda_sides_are_refused_cleanly_without_a_gpu(tmp_path, capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert cli.main(["compare", "--against", sys.executable, "--device", "cuda", "--no-count"]) == 2
    err = capsys.readouterr().err
    assert "--device cuda: no CUDA device here" in err
    assert "Traceback" not in err
    # A side checks too (another interpreter's, which the driver cannot ask), replying one line without a traceback
    # (side.py's SideRefused); its check is loaded here from the file, as starting a side would take seconds.
    loader = importlib.util.spec_from_file_location("ckptspec_side_probe", SIDE)
    assert loader is not None
    assert loader.loader is not None
    side = importlib.util.module_from_spec(loader)
    loader.loader.exec_module(side)
    assert side.device_problem("cuda", 1).startswith("--device cuda: no CUDA device here")
    assert side.device_problem("cpu", 4) is None
