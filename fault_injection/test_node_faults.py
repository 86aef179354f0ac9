"""A lost node: every process of one torchrun launch killed in a phase of a save, then the job run again.

Two launches of `fault_injection.node_trainer` on loopback stand for two nodes of one rank each (c10d rendezvous,
hosted by node 0's agent, gloo). Once rank 1's save is held in the phase, the test SIGKILLs node 1 whole: its agent,
its rank and the rank's workers, as a node failure does. Rank 0's save must raise within the bound; rank 0 then
exits 1, and node 0's torchrun (`--max-restarts=0`) must fail the job rather than wait. The job is then started
again on two nodes, as a scheduler requeues it, and its ranks check what is on disk.

torchrun's own restart (`--max-restarts=1` on node 0, a replacement node joining the next rendezvous round) is not
used: with torch 2.13's c10d rendezvous the surviving agent keeps the bootstrap store address of its first round
and never publishes it for the next, so a replacement agent waits for it until the rendezvous times out.
The test also stands for the launched mode's fault story (issue 19): a launched rank cannot be killed inside a
pytest session without ending it, so node faults are driven from outside, by launches.
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
JOB_END_BOUND = 60.0  # seconds for node 0's torchrun to end the job once its rank has failed


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

    def job(log_dir) -> list:
        """Start both nodes of one job (node 0's agent hosts the rendezvous), each with its log in log_dir."""
        port = loopback.free_port()
        commands = [
            loopback.torchrun_command(
                [str(work), phase],
                nodes=2,
                nproc_per_node=1,
                port=port,
                run_id=f"lost-node-{port}",
                module="fault_injection.node_trainer",
                rdzv_conf=f"is_host={int(host)}",
            )
            for host in (True, False)
        ]
        log_dir.mkdir(exist_ok=True)
        return loopback.start_commands(commands, log_dir=log_dir, env=env)

    # The trainers' temporary files go to the audited TMPDIR of the test; torchrun's own (killed with node 1) do not.
    env = dict(os.environ, TMPDIR=str(logs), CKPTSPEC_FI_TMPDIR=faults.current_tmpdir or "")
    nodes = job(logs)
    try:
        _wait_for(str(work / "in-phase"), LAUNCH_BOUND, nodes)
        nodes[1].kill()
        _wait_for(str(work / "outcome.json"), BOUND + 30, nodes)
        failed = loopback.wait(nodes[:1], JOB_END_BOUND)
        nodes += job(logs / "again")
        codes = loopback.wait(nodes[2:], LAUNCH_BOUND)
    finally:
        for launch in nodes:
            launch.kill()
    output = "\n".join(f"----- launch {i}\n{launch.output[-3000:]}" for i, launch in enumerate(nodes))
    outcome = json.loads((work / "outcome.json").read_text())["outcome"]
    assert outcome not in ("returned", HUNG), (
        f"rank 0's save, during which rank 1's node was lost ({phase}): {outcome}; it should raise within {BOUND:g}s"
    )
    assert failed[0] not in (0, None), f"node 0's torchrun, after node 1 was lost: exit {failed[0]}\n{output}"
    assert codes == [0, 0], f"the job run again exited {codes}\n{output}"
    for rank in (0, 1):
        record = json.loads((work / f"recovered{rank}.json").read_text())
        assert record["old"] == "returned", f"rank {rank} after the restart: the previous checkpoint: {record['old']}"
        if record["new_committed"]:
            assert record["new"] == "returned", f"rank {rank}: the interrupted save was committed: {record['new']}"
