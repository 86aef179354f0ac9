"""impl's collectives of flags under NCCL (ckptspec/impl/utils.py `all_reduce`: the queue's polls, the plan's
agreement) wait for no kernel the trainer has queued: the flags go over a side stream of their own, so a poll made
while a training step runs on the GPU returns with the step still running. The contract no spec clause states (the
clauses judge what a poll reports, not what it waits for). A GPU test: it skips without CUDA, and the GPU
machine's impl stages run it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

_POLL = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    from ckptspec.impl.utils import all_reduce

    def main():
        torch.cuda.set_device(0)
        dist.init_process_group("nccl", store=dist.FileStore(sys.argv[1], 1), rank=0, world_size=1)
        all_reduce([0], dist.ReduceOp.MAX)  # NCCL's communicator made before the step is queued
        torch.cuda.synchronize()
        torch.cuda._sleep(5_000_000_000)  # the training step in flight: seconds of one kernel on the GPU
        step_done = torch.cuda.Event()
        step_done.record()
        reduced = all_reduce([3, -1], dist.ReduceOp.MAX)
        print("step still running:", not step_done.query(), "reduced:", reduced, flush=True)
        torch.cuda.synchronize()
        dist.destroy_process_group()

    if __name__ == "__main__":
        main()
    """
)


@pytest.mark.gpu  # skips without CUDA (the spec plugin); run by the GPU machine's impl stages
def test_a_poll_under_nccl_waits_for_no_kernel_the_trainer_queued(tmp_path):
    script = tmp_path / "poll.py"
    script.write_text(_POLL)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "store")], capture_output=True, text=True, timeout=180
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert "reduced: [3, -1]" in done.stdout, done.stdout
    assert "step still running: True" in done.stdout, (
        "the all-reduce of flags returned only once the trainer's queued kernel had ended: " + done.stdout
    )
