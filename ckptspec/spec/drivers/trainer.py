"""A trainer that starts one save and ends normally without wait() or close() (P-EXIT-2, P-EXIT-3).

    python -m ckptspec.spec.drivers.trainer CHECKPOINT [--multiprocessing]

World of one rank (gloo, a FileStore next to CHECKPOINT); the target is CKPTSPEC_IMPL's. Once the save is
started it writes CHECKPOINT + ".started": the test bounds the exit from then (start-up is not the subject). The
test starts it in a session of its own and checks that nothing of that session remains once it has exited.
With --multiprocessing the trainer is a process started by multiprocessing (spawn, as torch.multiprocessing.spawn
starts ranks), which runs no atexit hook at its end, only multiprocessing's exit finalizers; this process waits
for it and exits with its exit code.
"""

import multiprocessing
import sys
from typing import Any

import torch.distributed as dist

from ckptspec.spec.drivers.protocol_saves import rank_state
from ckptspec.spec.harness.surface.loading import current_target
from ckptspec.spec.harness.surface.saver_api import protocol_saver


def main(path: str) -> Any:
    """Start the save and return the saver, which the trainer keeps to its end (but never closes)."""
    current_target()  # installs the adapter, as a rank does
    dist.init_process_group("gloo", store=dist.FileStore(path + ".store", 1), rank=0, world_size=1)
    saver = protocol_saver()
    saver.start(rank_state(0, 1, 1 << 20), path)
    with open(path + ".started", "w") as f:
        f.write("started")
    return saver


def _spawned(path: str) -> None:
    global SAVER
    SAVER = main(path)


if __name__ == "__main__":
    if sys.argv[2:] == ["--multiprocessing"]:
        child = multiprocessing.get_context("spawn").Process(target=_spawned, args=(sys.argv[1],))
        child.start()
        child.join()
        sys.exit(child.exitcode)
    SAVER = main(sys.argv[1])
