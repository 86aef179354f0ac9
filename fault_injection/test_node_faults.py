"""A lost node: every process of one torchrun launch killed in a phase of a save, then torchrun's restart of the job.

Two launches of `fault_injection.node_trainer` on loopback stand for two nodes of one rank each (c10d rendezvous,
hosted by node 0's agent, gloo). Once rank 1's save is held in the phase, the test SIGKILLs node 1 whole: its agent,
its rank and the rank's workers, as a node failure does. Rank 0's save must raise within the bound; rank 0 then
exits 1 and node 0's agent (`--max-restarts=1`) restarts the job, which a replacement node 1 joins, and the restarted
ranks check what is on disk. The test also stands for the launched mode's fault story (issue 19): a launched rank
cannot be killed inside a pytest session without ending it, so node faults are driven from outside, by launches.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from fault_injection import faults
from fault_injection.faults import BOUND
from spec_tests.harness import HUNG, loopback

LAUNCH_BOUND = 240.0  # seconds for a launch (start-up of torch and the target on a loaded machine included)


def _wait_for(path: str, seconds: float, nodes) -> None:
    deadline = time.monotonic() + seconds
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            output = "\n".join(f"----- node {i}\n{node.output[-3000:]}" for i, node in enumerate(nodes))
            pytest.fail(f"{os.path.basename(path)} did not appear within {seconds:g}s\n{output}")
        time.sleep(0.05)


@pytest.mark.spec("FI-NODE-3")
@pytest.mark.needs("persistent_caller")
@pytest.mark.parametrize("phase", ["plan", "staging", "write", "finalize"])
def test_lost_node(target, tmp_path, phase):
    if phase == "plan" and not target.has("storage_writer"):
        pytest.skip("the target has no storage writer, so its saves have no planning phase")
    work, logs = tmp_path / "work", tmp_path / "launcher"
    work.mkdir()
    logs.mkdir()
    port = loopback.free_port()

    def node(host: bool, restarts: int) -> list[str]:
        return loopback.torchrun_command(
            [str(work), phase],
            nodes=2,
            nproc_per_node=1,
            port=port,
            run_id=f"lost-node-{port}",
            module="fault_injection.node_trainer",
            max_restarts=restarts,
            rdzv_conf=f"is_host={int(host)}",
        )

    # The trainers' temporary files go to the audited TMPDIR of the test; torchrun's own (killed with node 1) do not.
    env = dict(os.environ, TMPDIR=str(logs), CKPTSPEC_FI_TMPDIR=faults.current_tmpdir or "")
    nodes = loopback.start_commands([node(True, 1), node(False, 0)], log_dir=logs, env=env)
    try:
        _wait_for(str(work / "in-phase"), LAUNCH_BOUND, nodes)
        nodes[1].kill()
        _wait_for(str(work / "outcome.json"), BOUND + 30, nodes)
        outcome = json.loads((work / "outcome.json").read_text())["outcome"]
        (logs / "replacement").mkdir()
        nodes += loopback.start_commands([node(False, 0)], log_dir=logs / "replacement", env=env)
        codes = loopback.wait([nodes[0], nodes[2]], LAUNCH_BOUND)
    finally:
        for launch in nodes:
            launch.kill()
    output = "\n".join(f"----- node {i}\n{launch.output[-3000:]}" for i, launch in enumerate(nodes))
    assert outcome not in ("returned", HUNG), (
        f"rank 0's save, during which rank 1's node was lost ({phase}): {outcome}; it should raise within {BOUND:g}s"
    )
    recovered = [json.loads((work / f"recovered{rank}.json").read_text()) for rank in (0, 1)]
    assert codes == [0, 0], f"the restarted job (node 0 and its replacement) exited {codes}\n{output}"
    assert recovered[0]["restart"] == 1, f"node 0's agent did not restart its rank: {recovered}"
    for rank, record in enumerate(recovered):
        assert record["old"] == "returned", f"rank {rank} after the restart: the previous checkpoint: {record['old']}"
        if record["new_committed"]:
            assert record["new"] == "returned", f"rank {rank}: the interrupted save was committed: {record['new']}"
