"""The cost gate's peer for any protocol adapter (ckptspec/bench/adapter_peer.py), its yardstick
(ckptspec/bench/slowed_adapter.py) and its outputs for CI tools (ckptspec/bench/regression/export.py).

- `protocol:ADAPTER` saves through the adapter's saver: the checkpoint holds the state as it was when the trainer
  was let go (the snapshot check of the stall benchmark), and the save counts as in flight until `wait`;
- the regression pass measures `dcp:impl` for impl and `protocol:NAME` for any other target or adapter, and a
  baseline recorded with `--impl` names that peer in its summary;
- the slowed adapter sleeps (FACTOR - 1) times what each call took, and refuses a factor below 1;
- the github-action-benchmark JSON lists each gated figure of the run as the gate compared it, and the summary
  says the verdict and shows every figure.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ckptspec.bench import slowed_adapter
from ckptspec.bench.adapter_peer import IMPL_PEER, PREFIX, regression_peer
from ckptspec.bench.peers import make_peer, unavailable
from ckptspec.bench.regression import export
from ckptspec.bench.regression.__main__ import baseline_peer, parser
from ckptspec.bench.regression.baseline import Baseline
from ckptspec.bench.regression.compare import Row
from ckptspec.bench.regression.measure import Settings
from ckptspec.bench.workload import negate_, saved_before_update

SLOWED = PREFIX + "ckptspec.bench.slowed_adapter"


def test_the_regression_pass_measures_the_peer_of_the_run_target():
    assert regression_peer("impl") == IMPL_PEER
    assert regression_peer("mylib.ckptspec_adapter") == "protocol:mylib.ckptspec_adapter"


def test_an_adapter_peer_saves_the_state_the_trainer_handed_it(process_group, state_dict, paths):
    assert unavailable(SLOWED) is None
    assert unavailable(PREFIX + "no_such_adapter_module") is not None
    peer = make_peer(SLOWED)
    try:
        path = paths.new()
        peer.save(state_dict, path)
        peer.before_update()
        assert peer.poll(), "a protocol save counts as in flight until wait()"
        negate_(state_dict)
        peer.wait()
        assert not peer.poll()
        assert saved_before_update(peer.family, path, state_dict), "the checkpoint lacks the state at save()"
    finally:
        peer.close()


def test_the_slowed_adapter_sleeps_the_factor_less_one_times_each_call(monkeypatch):
    clock, slept = iter([10.0, 10.5]), list[float]()
    monkeypatch.setattr(slowed_adapter.time, "perf_counter", lambda: next(clock))
    monkeypatch.setattr(slowed_adapter.time, "sleep", slept.append)
    monkeypatch.setenv(slowed_adapter.SLOWDOWN_ENV, "1.5")
    assert slowed_adapter.slowed(lambda: "done") == "done"
    assert slept == [pytest.approx(0.25)]
    monkeypatch.setenv(slowed_adapter.SLOWDOWN_ENV, "0.5")
    with pytest.raises(ValueError, match="at least 1"):
        slowed_adapter.factor()


def _rows() -> list[Row]:
    return [
        Row("test_stall[protocol:x]", True, 3.0, 1.0, "x memcpy", 3.0, "REGRESSED"),
        Row("test_load[protocol:x]", True, 1.1, 1.0, "x memcpy", 1.1, "ok"),
        Row("test_memcpy", False, 0.01, 0.01, "s", 1.0, "reference"),
        Row("test_new[protocol:x]", True, 0.5, None, "s", None, "new"),
    ]


def test_the_action_json_lists_each_gated_figure_as_compared():
    entries = export.action_benchmark(_rows())
    assert [e["name"] for e in entries] == ["test_stall[protocol:x]", "test_load[protocol:x]", "test_new[protocol:x]"]
    assert entries[0] == {
        "name": "test_stall[protocol:x]",
        "unit": "x memcpy",
        "value": 3.0,
        "extra": "3.000x the baseline (REGRESSED)",
    }
    assert entries[2]["extra"] == "not in the baseline"


def test_the_summary_says_the_verdict_and_shows_every_figure():
    text = export.summary(_rows(), 2.0, "FAIL: 1 of 3 gated figures beyond 2x", "protocol:x")
    assert text.startswith("## ckptspec cost gate: `protocol:x`\n\n**red** (2x gate): FAIL")
    for name in ("test_stall[protocol:x]", "test_load[protocol:x]", "test_memcpy", "test_new[protocol:x]"):
        assert f"`{name}`" in text
    assert "reference (not gated)" in text


def test_a_baseline_recorded_with_impl_names_its_peer():
    args = parser().parse_args(["record", "--out", "b.json", "--impl", "mylib.adapter"])
    assert args.impl == "mylib.adapter"
    for pytest_args, peer in ((["--impl", "mylib.adapter"], "protocol:mylib.adapter"), ([], IMPL_PEER)):
        base = Baseline({"settings": Settings(pytest_args=pytest_args).as_dict(), "figures": {}})
        assert baseline_peer(base) == peer


@pytest.mark.parametrize(
    ("impl", "peer", "absent"),
    [("impl", IMPL_PEER, SLOWED), ("ckptspec.bench.slowed_adapter", SLOWED, "dcp:impl")],
    ids=["impl", "adapter"],
)
def test_the_regression_set_measures_the_saver_of_impl_only(request, impl, peer, absent):
    """`--impl` decides which saver the regression set times; an adapter's set times nothing of impl."""
    command = [sys.executable, "-m", "pytest", "ckptspec/bench", "-m", "regression", "--collect-only", "-q"]
    command += ["-p", "no:randomly", "--impl", impl]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "CKPTSPEC_"))}
    done = subprocess.run(command, cwd=request.config.rootpath, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert any(f"[{peer}]" in i for i in ids), ids
    assert not any(absent in i for i in ids), ids
