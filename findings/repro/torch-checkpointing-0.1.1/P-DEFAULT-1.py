"""P-DEFAULT-1 on torch_checkpointing 0.1.1: with its default storage, a save into a directory on an ext4 disk
fails with EINVAL, so the library as installed writes no checkpoint there.

    python findings/repro/torch-checkpointing-0.1.1/P-DEFAULT-1.py torch_checkpointing

Clause (documented, data-loss): in the configuration a library runs by default (changed only where its documents
tell a user of this machine to change it), a save into a new directory of the machine's local file system, of tensors
of any size, commits and loads exactly. Source: the library's README: "the default local filesystem backend treats
it as the path to a checkpoint directory", and "Saving is asynchronous by default. The optimized async staging
defaults currently require CUDA; CPU-only users should use the explicit configuration in Troubleshooting" (the one
change made here without CUDA: staging without pinned memory or non-blocking copies).

Mechanism (torch_checkpointing/storage/filesystem.py): `LocalFileSystemStorageConfig()` has use_direct_io=True, so
WriteStream opens each file with os.O_DIRECT (:76) and wraps the descriptor in a buffered file object (os.fdopen,
:77); torch.save's zip writer writes records of any length through it, and the first write or flush whose length is
not a multiple of the block size fails with OSError: [Errno 22] Invalid argument (:108-119). The fallback to ordinary
I/O (:81-95) catches only an open() that fails, as on tmpfs, where the save succeeds.

One process saves {"w": a byte tensor of 4097 bytes} with the default CheckpointManager into a new directory below
the current directory (run it from a directory on a disk such as ext4 or xfs, not tmpfs; the directory is removed
at the end), waits on the save's future and loads it back. Prints what it saw; exits 1 where the clause is broken, 0 where it holds, 2 when it
could not run.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile


def _file_system(path: str) -> str:
    best = ("unknown", "")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, point, kind, *_ = line.split()
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best[1]):
                best = (kind, point)
    return f"{best[0]} (mounted at {best[1]})"


def _manager():
    import torch
    from torch_checkpointing import CheckpointManager
    from torch_checkpointing.config import AsyncCheckpointSaverConfig
    from torch_checkpointing.staging import CheckpointStagerConfig

    cuda = torch.cuda.is_available()
    staging = CheckpointStagerConfig(use_pinned_memory=cuda, use_non_blocking_copy=cuda)
    return CheckpointManager(CheckpointManager.Config(save=AsyncCheckpointSaverConfig(staging_config=staging)))


def main() -> int:
    if sys.argv[1:] != ["torch_checkpointing"]:
        print(f"usage: {sys.argv[0]} torch_checkpointing", file=sys.stderr)
        return 2
    import torch

    tmp = tempfile.mkdtemp(prefix="p-default-1-", dir=os.getcwd())
    path = os.path.join(tmp, "step-1")
    print(f"saving into a new directory on {_file_system(tmp)}")
    state = {"w": (torch.arange(4097) % 251).to(torch.uint8)}
    manager = _manager()
    try:
        try:
            manager.save(path, {"state": state}).result(timeout=300)
        except Exception as exc:  # what the save raised is the finding
            print(f"the save's future raised {type(exc).__name__}: {str(exc).strip().splitlines()[-1]}")
            print(f"the directory holds: {sorted(os.listdir(tmp))}")
            print("BROKEN: the default configuration saved nothing into a local directory")
            return 1
        into = {"state": {"w": torch.zeros(4097, dtype=torch.uint8)}}
        manager.load(path, into=into)
        if not torch.equal(into["state"]["w"], state["w"]):
            print("BROKEN: the checkpoint the save reported loads with other values")
            return 1
        print(f"HOLDS: the save committed {sorted(os.listdir(path))} and loads exactly")
        return 0
    finally:
        try:
            manager.close()
        except Exception as exc:  # close() re-raises the save's error: already reported
            print(f"close() raised {type(exc).__name__} too")
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
