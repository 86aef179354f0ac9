"""FI-STORAGE-2 on torchtitan 0.3.0: one failed async save wedges CheckpointManager for good.

    python findings/repro/torchtitan-0.3.0/FI-STORAGE-2.py torchtitan

Clause (implied, data-loss): after a storage error the next save on the same saver succeeds. Source: torchtitan's
own docstrings: `maybe_wait_for_saving` "Block until the last asynchronous save completes"; `save` "Persist state
for curr_step".

Mechanism (torchtitan/components/checkpointer/dcp.py, `_wait_for_saving`): `self.save_future.result()` comes
before `self.save_future = None`, so when the save failed, result() raises and the failed future stays. Every later
`save()` begins with `maybe_wait_for_saving()`, which raises that same old error again before saving anything: the
manager never writes another checkpoint.

One process, a world of one rank (gloo), `async_mode="async"`: step 1's data file cannot be written (a directory
stands at `step-1/__0_0.distcp`; the write fails in async_save's thread), step 2's can. Prints what it saw; exits 1 where the clause is broken, 0 where it holds, 2 when it
could not run.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

FAILURES = (Exception, CheckpointException)  # CheckpointException is a BaseException


def main() -> int:
    if sys.argv[1:] != ["torchtitan"]:
        print(f"usage: {sys.argv[0]} torchtitan", file=sys.stderr)
        return 2
    from torchtitan.components.checkpointer.dcp import CheckpointManager

    class Counter:  # a Stateful stand-in for the optimizers and LR schedulers containers
        def state_dict(self):
            return {"steps": 0}

        def load_state_dict(self, state_dict):
            pass

    tmp = tempfile.mkdtemp(prefix="repro-torchtitan-")
    dist.init_process_group("gloo", store=dist.FileStore(os.path.join(tmp, "store"), 1), rank=0, world_size=1)
    try:
        config = CheckpointManager.Config(enable=True, folder="ckpt", interval=1, async_mode="async", keep_latest_k=0)
        manager = CheckpointManager(
            config,
            dataloader=None,
            model_parts=[torch.nn.Linear(2, 2)],
            optimizers=Counter(),
            lr_schedulers=Counter(),
            states={},
            sd_adapter=None,
            base_folder=tmp,
        )
        os.makedirs(os.path.join(tmp, "ckpt", "step-1", "__0_0.distcp"))  # its data file cannot be created
        manager.save(1)
        try:
            manager.maybe_wait_for_saving()
            print("step 1's save did not fail: cannot reproduce")
            return 2
        except FAILURES as exc:
            print(f"step 1 failed as it should: {type(exc).__name__}")
        try:
            manager.save(2)
            manager.maybe_wait_for_saving()
        except FAILURES as exc:
            written = os.path.exists(os.path.join(tmp, "ckpt", "step-2", ".metadata"))
            print(f"BROKEN: saving step 2, to a good directory, raised {type(exc).__name__} (step 1's failure again)")
            print(f"        step 2 {'was written' if written else 'was never written'}")
            return 1
        finally:
            manager.close()
        print("HOLDS: step 2 was saved after step 1 failed")
        return 0
    finally:
        dist.destroy_process_group()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
