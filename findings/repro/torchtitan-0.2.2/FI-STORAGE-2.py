"""FI-STORAGE-2 on torchtitan 0.2.2: one failed async save wedges CheckpointManager for good.

    python findings/repro/torchtitan-0.2.2/FI-STORAGE-2.py torchtitan

Clause (implied, data-loss): after a storage error the next save on the same saver succeeds. Source: torchtitan's
own docstring: `save` "Save the checkpoint for the current step. This function will save the checkpoint for the
current step."

Mechanism (torchtitan/components/checkpoint.py:828-842, `_async_wait`): `self.save_future.result()` comes before
`self.save_future = None`, so when the save failed, result() raises and the failed future stays. Every later
`save()` calls `_async_wait()` first (checkpoint.py:508), which raises that same old error again before saving
anything: the manager never writes another checkpoint. (0.2.2 has no public wait for a save: the next save() is
where a trainer learns of a failure, once; the break is that it learns it again at every save after.)

One process, a world of one rank (gloo), `async_mode="async"`: step 1's data file cannot be written (a directory
stands at `step-1/__0_0.distcp`; the write fails in async_save's thread), steps 2 and 3 go to good directories.
Prints what it saw; exits 1 where the clause is broken, 0 where it holds, 2 when it could not run.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

FAILURES = (Exception, CheckpointException)  # CheckpointException is a BaseException


def main() -> int:
    if sys.argv[1:] != ["torchtitan"]:
        print(f"usage: {sys.argv[0]} torchtitan", file=sys.stderr)
        return 2
    from torchtitan.components.checkpoint import CheckpointManager
    from torchtitan.config import Checkpoint

    class Counter:  # a Stateful stand-in for the optimizers and LR schedulers containers
        def state_dict(self):
            return {"steps": 0}

        def load_state_dict(self, state_dict):
            pass

    tmp = tempfile.mkdtemp(prefix="repro-torchtitan-")
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0, world_size=1)
    try:
        config = Checkpoint(enable=True, folder="ckpt", interval=1, async_mode="async", keep_latest_k=0)
        manager = CheckpointManager(
            dataloader=None,
            model_parts=[torch.nn.Linear(2, 2)],
            optimizers=Counter(),
            lr_schedulers=Counter(),
            states={},
            checkpoint_config=config,
            sd_adapter=None,
            base_folder=tmp,
        )
        os.makedirs(os.path.join(tmp, "ckpt", "step-1", "__0_0.distcp"))  # its data file cannot be created
        manager.save(1)
        errors = []
        for step in (2, 3):
            try:
                manager.save(step)
                errors.append(None)
            except FAILURES as exc:
                errors.append(type(exc).__name__)
        print(f"save(2), save(3) raised: {errors} (step 1's failure may be reported once, at save(2))")
        deadline = time.monotonic() + 60
        step3 = os.path.join(tmp, "ckpt", "step-3", ".metadata")
        while errors[1] is None and not os.path.exists(step3) and time.monotonic() < deadline:
            time.sleep(0.1)
        written = [s for s in (2, 3) if os.path.exists(os.path.join(tmp, "ckpt", f"step-{s}", ".metadata"))]
        print(f"checkpoints written after step 1 failed: {written}")
        manager.close()
        if errors[1] is not None or not written:
            print("BROKEN: after one failed save, the manager raises the old error again and writes nothing more")
            return 1
        print("HOLDS: a later step was saved after step 1 failed")
        return 0
    finally:
        dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
