"""The launched mode without a cluster (issue 19): two torchrun "nodes" on loopback (c10d rendezvous, gloo).

The same selection runs forked (no launcher) and on two launches of one rank each, and the two conformance JSON files
must agree test by test and clause by clause, but for the one test that needs more ranks than the launched world
(it skips, with the reason). The selection covers what the launched runner must get right: pools and one-shot runs,
a failing and a hung rank reported with every rank's outcome, a declared death (forked on rank 0's node), and spec
tests whose collectives span both "nodes". Bad uses are refused with one line: pytest-xdist under torchrun, and
nodes that collected different tests. The full suite on two nodes: `nox -s launched` (see noxfile.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path

import pytest

from ckptspec.spec.harness.ranks import loopback
from harness_tests.pytest_runs import clean_env, run_pytest

LAUNCH_TIMEOUT = 420.0
DIST = "harness_tests/test_dist.py"
QUEUE = "ckptspec/spec/async_ckpt/test_queue.py"
SELECTION = [
    f"{DIST}::test_results_come_back_from_every_rank",  # 3 ranks: skips on a world of 2
    f"{DIST}::test_a_failing_rank_is_reported_with_every_other_rank",
    f"{DIST}::test_a_pool_reports_a_hung_rank_and_recovers",
    f"{DIST}::test_a_declared_death_is_not_a_failure",
    f"{DIST}::test_the_decorator_runs_the_body_on_every_rank_with_fixtures",
    f"{QUEUE}::test_a_poll_is_one_single_integer_all_reduce_and_no_dist_is_none",
    f"{QUEUE}::test_async_fn_error_on_one_rank_raises_on_every_rank[persistent]",
]
TOO_MANY_RANKS = SELECTION[0]
OPTIONS = ["-p", "no:xdist", "-p", "no:randomly", "-q", "-rs"]


@pytest.fixture
def short_dir():
    """A directory with a short path for the launches' logs and TMPDIR: the ranks' forkserver sockets go there, and an
    AF_UNIX path has at most 107 bytes (a pytest-xdist worker's tmp_path is too long)."""
    path = tempfile.mkdtemp(prefix="ckptspec-lb-")
    yield Path(path)
    shutil.rmtree(path, ignore_errors=True)


def _launch(short_dir, args: list[str], name: str, **kwargs) -> tuple[list[int | None], str]:
    log_dir = short_dir / name
    log_dir.mkdir()
    env = clean_env(HYPOTHESIS_PROFILE="ci")
    nodes = loopback.start(args, log_dir=log_dir, env=env, **kwargs)
    codes = loopback.wait(nodes, LAUNCH_TIMEOUT)
    return codes, "\n".join(f"----- node {i} (exit {codes[i]})\n{node.output}" for i, node in enumerate(nodes))


def test_two_loopback_nodes_give_the_forked_verdicts(tmp_path, short_dir):
    forked_json, launched_json = tmp_path / "forked.json", tmp_path / "launched.json"
    forked = run_pytest(
        [*SELECTION, *OPTIONS, "--conformance-json", str(forked_json)], env=clean_env(HYPOTHESIS_PROFILE="ci")
    )
    assert forked.code == 0, forked.describe()
    codes, output = _launch(short_dir, [*SELECTION, *OPTIONS, "--conformance-json", str(launched_json)], "launched")
    assert codes == [0, 0], output
    assert launched_json.exists(), output
    assert "needs 3 ranks; the launched world has 2" in output, output
    assert "forked their ranks on rank 0's node" in output
    assert "test_a_declared_death_is_not_a_failure" in output
    # The harness test needing more ranks than the world is the mode's own skip (it cites no clause): listed apart,
    # and no test's outcome nor any clause's cell may differ.
    assert loopback.launched_only_skips(forked_json, launched_json) == [TOO_MANY_RANKS]
    problems = loopback.compare(forked_json, launched_json)
    assert problems == [], "\n".join(problems)
    records = [
        [(t["nodeid"], t["when"]) for t in json.loads(p.read_text())["tests"]] for p in (forked_json, launched_json)
    ]
    assert sorted(records[1]) == sorted(records[0]), "rank 0 alone reports: every test once, as a forked run does"


def test_nodes_that_collected_different_tests_are_refused(short_dir):
    """Two launches (nodes) started with different selections: rank 0 names the difference and runs nothing."""
    port = loopback.free_port()
    commands = [
        loopback.torchrun_command(
            [*OPTIONS, selection], nodes=2, nproc_per_node=1, port=port, run_id=f"mismatch-{port}"
        )
        for selection in (SELECTION[1], SELECTION[2])
    ]
    log_dir = short_dir / "logs"
    log_dir.mkdir()
    nodes = loopback.start_commands(commands, log_dir=log_dir, env=clean_env())
    codes = loopback.wait(nodes, LAUNCH_TIMEOUT)
    output = nodes[0].output + nodes[1].output
    assert None not in codes, output
    assert codes != [0, 0], output
    assert "the launched ranks collected different tests" in output, output


@pytest.mark.parametrize("xdist", [["-n", "2"], ["--dist", "load"]])
def test_pytest_xdist_is_refused_under_torchrun(xdist):
    """Checked before anything connects: the launcher's variables alone (no store listens) give the usage error."""
    env = clean_env(TORCHELASTIC_RUN_ID="fake", MASTER_ADDR="127.0.0.1", MASTER_PORT="1", RANK="0", WORLD_SIZE="2")
    run = run_pytest([SELECTION[1], *xdist], env=env, timeout=120)
    run.assert_clean_failure("pytest-xdist must be off", "-p no:xdist")
