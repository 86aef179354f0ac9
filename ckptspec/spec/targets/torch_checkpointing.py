"""Adapter for torch-checkpointing 0.1.1 (`torch_checkpointing`, PyTorch's checkpoint library): its
`CheckpointManager` with an async saver (the default `CheckpointManager.Config()`), through the protocol layer only;
written against the documented adapter contract (ckptspec.spec.harness.surface.contract), as an outside author would.

What the library offers (`torch_checkpointing/checkpoint_manager.py`): `save(checkpoint_id, {item: value})`, which
returns the write Future ("await it to block until the checkpoint is durable", checkpoint_manager.py:185-186) and,
by its README, "returns immediately"; `lock()`, the guard for an in-place update ("typically ``optimizer.step()`` --
as ``with manager.lock(): optimizer.step()`` so the update cannot mutate params while an async save is still
capturing them", checkpoint_manager.py:303-305); `load`, `close`; a commit protocol by default (every rank writes
into `<parent>/tmp_<name>`, a store barrier, then rank 0 renames the directory onto `<name>`,
checkpoint_writer.py:215-317). No abort, no retention, no resume-latest (no manager).

How the five calls map:

- start(state, path): `manager.save(path, {"state": state})`. save() takes the staging lock for write before it
  returns (checkpoint_saver.py:395) and stages on a thread; the write runs in a spawned subprocess.
- staged(): `with manager.lock(): pass`: the read side of the staging RWLock, held off while save()'s write side
  is held, that is until staging is done: the library's documented way to wait before changing the state.
- wait(): the write Future's result(); it raises the subprocess's error on that rank.
- abort(): none (the default raises NotImplementedError); the library documents no way to stop a save.
- close(): `manager.close()`, which waits for the last write (wait_timeout_secs, 600 s by default) and ends the
  subprocess.

The configuration judged: the library's default `CheckpointManager.Config()`, which is also the asynchronous
configuration its documents recommend, with, on a machine without CUDA, the one change its documents tell a
CPU-only user to make: staging without pinned memory or non-blocking copies (docs/troubleshooting.md: "Async
staging defaults to pinned (page-locked) host memory and a non-blocking device-to-host copy, both of which
currently require CUDA"). Its storage, `LocalFileSystemStorageConfig()`, opens every file with O_DIRECT
(use_direct_io=True, storage/filesystem.py:72-80) and writes it through a buffered file object whose last,
unaligned flush fails with EINVAL on ext4 (`OSError: [Errno 22] Invalid argument` from WriteStream.flush,
filesystem.py:119; the fallback at filesystem.py:83 covers only an open that fails): on such a file system every
save of a file whose size is not a multiple of 4096 fails, which is itself the finding of this configuration. The
target `torch-checkpointing-buffered` (ckptspec.spec.targets.torch_checkpointing_buffered) is the same with
`LocalFileSystemStorageConfig(use_direct_io=False)`, the setting under which the library saves on ext4, so that
its commit protocol, staging and bounds are judged too.

The whole state dict travels as one item, "state", so that each rank writes one file, `state_<rank>.pt`
(default_torch_layout_info, checkpoint_layout.py:336-349); nothing else is written (no `metadata.pkl`: the metadata
file is written only with a metadata manager, which the manager wires only when an item declares a resharder,
checkpoint_manager.py:135-140). A checkpoint is complete when its directory exists under its own name: the
rename of `tmp_<name>` is the commit.
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from ckptspec.spec.harness.surface.formats import CheckpointFormat
from ckptspec.spec.harness.surface.saver_api import SaveHandle, Saver

NAME = "torch-checkpointing"
DISTRIBUTION = "torch-checkpointing"
INSTALL = 'pip install "torch==2.13.0" -e ".[test,torch-checkpointing]"'
MODULES: dict[str, str] = {}
PACKAGES = ("torch_checkpointing",)
CAPABILITIES = frozenset({"protocol"})
EXPECTATIONS = str(Path(__file__).with_name("torch-checkpointing.expectations.toml"))


ITEM = "state"
"""The one payload item the adapter saves: the test's state dict, whole."""


class RankFilesInRenamedDir(CheckpointFormat):
    """`state_<rank>.pt` per rank in a directory renamed into place by rank 0, read as the library reads them."""

    name = "torch_checkpointing torch layout (<item>_<rank>.pt, directory renamed from tmp_<name>)"
    loader = "torch.load of each rank's file (the layout's TorchSerialization, as CheckpointManager.load reads it)"
    dcp = False
    marker = None
    data_glob = f"{ITEM}_*.pt"

    def data_file(self, location: str, rank: int) -> str:
        return os.path.join(location, f"{ITEM}_{rank}.pt")

    def committed(self, location: str, world_size: int) -> bool:
        return all(os.path.isfile(self.data_file(location, rank)) for rank in range(world_size))

    def load(self, location: str, template: dict[str, Any]) -> dict[str, Any]:
        """Each rank's file through the library's reader (a sync manager, no process group: rank 0 of 1), merged."""
        import glob

        import torch

        files = sorted(glob.glob(os.path.join(location, self.data_glob)))
        if not files:
            raise FileNotFoundError(f"no {self.data_glob} file in {location}")
        merged: dict[str, Any] = {}
        ranks = max(int(os.path.basename(f)[len(ITEM) + 1 : -3]) for f in files) + 1
        for rank in range(ranks):
            # The library reads `<item>_<its own rank>.pt` by name; a reader in this process is rank 0, so each
            # rank's file is read with the serializer the layout names (TorchSerialization: torch.load).
            merged.update(torch.load(self.data_file(location, rank), weights_only=False))
        missing = sorted(set(template) - set(merged))
        if missing:
            raise KeyError(f"keys {missing} are in no file of {location}: {[os.path.basename(f) for f in files]}")
        return {key: merged[key] for key in template}


FORMAT = RankFilesInRenamedDir()


def _config(direct_io: bool) -> Any:
    import torch
    from torch_checkpointing import CheckpointManager
    from torch_checkpointing.config import AsyncCheckpointSaverConfig
    from torch_checkpointing.staging import CheckpointStagerConfig
    from torch_checkpointing.storage.filesystem import LocalFileSystemStorageConfig

    cuda = torch.cuda.is_available()
    staging = CheckpointStagerConfig(use_pinned_memory=cuda, use_non_blocking_copy=cuda)
    return CheckpointManager.Config(
        save=AsyncCheckpointSaverConfig(staging_config=staging),
        storage_config=LocalFileSystemStorageConfig(use_direct_io=direct_io),
    )


class _TorchCheckpointingHandle(SaveHandle):
    def __init__(self, saver: TorchCheckpointingSaver, future: Future[Any] | None):
        self.saver, self.future = saver, future

    def staged(self) -> None:
        with self.saver.manager.lock():
            pass

    def wait(self) -> None:
        if self.future is not None:
            self.future.result()


class TorchCheckpointingSaver(Saver):
    """One async CheckpointManager, kept across saves as a trainer keeps it."""

    def __init__(self, direct_io: bool) -> None:
        from torch_checkpointing import CheckpointManager

        self.manager = CheckpointManager(_config(direct_io))

    def start(self, state_dict: dict[str, Any], path: str) -> SaveHandle:
        return _TorchCheckpointingHandle(self, self.manager.save(path, {ITEM: state_dict}))

    def close(self) -> None:
        self.manager.close()


def protocol_saver(**options: Any) -> TorchCheckpointingSaver:
    """A new saver with the default storage (O_DIRECT); the library has one kind of writer (a spawned subprocess),
    so every option is ignored."""
    return TorchCheckpointingSaver(direct_io=True)
