"""An interrupted benchmark run still writes its JSON with every finished measurement (ckptspec/bench/interrupted.py).

Each case runs a small pytest session in a subprocess (pytest-benchmark and the guard alone: no torch, no suite)
whose second benchmark sends SIGINT to its own process at one place a rank can be when gpu_run's budget ends:
in a round's setup, in the first timed round, in a later one, in a round's teardown, blocked in a wait on another
process (where the H100 run's D2H stage was), and in a fixture's teardown after the benchmark finished.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RUN_BOUND_S = 120  # a pytest start-up on a loaded machine, twice over

SESSION = textwrap.dedent(
    """
    import multiprocessing, os, signal, threading
    import pytest

    PLACE = os.environ["CKPTSPEC_INTERRUPT_AT"]
    calls = {"round": 0}
    # A run started in the background (`cmd &`, nohup) inherits SIGINT ignored, and Python then leaves it ignored:
    # the session must raise KeyboardInterrupt as a gpu_run stage's does, wherever the suite was started from.
    signal.signal(signal.SIGINT, signal.default_int_handler)

    def interrupt(place):
        if place == PLACE:
            os.kill(os.getpid(), signal.SIGINT)

    @pytest.fixture
    def resource():
        yield
        interrupt("fixture-teardown")

    def test_a_finished(benchmark):
        benchmark.pedantic(lambda: None, rounds=3)

    def test_b_interrupted(benchmark, resource):
        def body():
            calls["round"] += 1
            interrupt("first-round" if calls["round"] == 1 else "later-round" if calls["round"] == 3 else None)
            if PLACE == "blocked" and calls["round"] == 2:
                event = multiprocessing.get_context("spawn").Event()
                threading.Thread(target=interrupt, args=("blocked",), daemon=True).start()
                event.wait(60)

        benchmark.pedantic(body, setup=lambda: interrupt("setup"), teardown=lambda: interrupt("teardown"), rounds=4)

    def test_c_never_reached(benchmark):
        benchmark.pedantic(lambda: None, rounds=1)
    """
)
PLACES = ("setup", "first-round", "later-round", "teardown", "blocked", "fixture-teardown")


@pytest.mark.parametrize("place", PLACES)
def test_an_interrupted_run_keeps_every_finished_measurement(tmp_path: Path, place: str) -> None:
    (tmp_path / "test_session.py").write_text(SESSION)
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    out = tmp_path / "bench.json"
    command = [sys.executable, "-m", "pytest", "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path)]
    command += ["-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:xdist", "-p", "ckptspec.bench.interrupted"]
    command += ["--benchmark-json", str(out), "-q", str(tmp_path / "test_session.py")]
    env = {"PYTHONPATH": str(ROOT), "CKPTSPEC_INTERRUPT_AT": place, "PATH": "/usr/bin:/bin"}
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=RUN_BOUND_S)
    log = done.stdout + done.stderr
    assert done.returncode == pytest.ExitCode.INTERRUPTED, f"the session was not interrupted at {place}:\n{log}"
    assert out.is_file(), f"interrupted at {place}, the run wrote no JSON:\n{log[-3000:]}"
    rounds = {bench["name"]: bench["stats"]["rounds"] for bench in json.loads(out.read_text())["benchmarks"]}
    assert rounds.get("test_a_finished") == 3, f"the finished benchmark was lost (interrupted at {place}): {rounds}"
    assert "test_c_never_reached" not in rounds
    assert all(n >= 1 for n in rounds.values()), rounds
    finished = place in ("teardown", "fixture-teardown", "later-round", "blocked")
    assert ("test_b_interrupted" in rounds) == finished, f"partial measurement of {place}: {rounds}"
