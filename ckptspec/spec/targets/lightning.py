"""Adapter for Lightning's `AsyncCheckpointIO` over its default `TorchCheckpointIO` (pytorch-lightning 2.6.6 and
2.5.3), through the protocol layer only; written against the documented adapter contract
(ckptspec.spec.harness.surface.contract), as an outside author would.

What Lightning offers, and how the five calls map onto it (`pytorch_lightning/plugins/io/async_plugin.py`):

- start(state, path): `AsyncCheckpointIO.save_checkpoint(state, path/rank-<rank>.ckpt)` then a barrier, as
  `Trainer.save_checkpoint` does (`strategy.save_checkpoint(...)`, then `strategy.barrier("Trainer.save_checkpoint")`).
  save_checkpoint submits `TorchCheckpointIO.save_checkpoint` to a `ThreadPoolExecutor(max_workers=1)`; since 2.5.4
  it first clones every tensor on the caller thread (#21079).
- staged(): the default (at once): Lightning has no staging signal; its copy, where it makes one, is made in start.
- wait(): `teardown()`, the only wait Lightning has ("This method is called to close the threads."): it waits for
  every save queued so far on this rank and raises the error any of them stored (there is no per-save handle);
  then a barrier, so that wait() returns once every rank's file is written, as the protocol's collective wait
  does. Lightning passes no error between ranks: a rank whose teardown() raises never reaches the barrier.
- abort(): none (the default raises NotImplementedError); Lightning documents no way to stop a save.
- close(): `teardown()`.

Format (FORMAT): one `torch.save` file per rank, `rank-<rank>.ckpt`, written by `_atomic_save` (torch.save into a
BytesIO, then an fsspec transaction: a temporary file in the system's temp directory, moved onto the path);
complete when every rank's file is there; read back with `TorchCheckpointIO.load_checkpoint`, Lightning's loader,
with `weights_only=False` (2.5.3's default; 2.6 leaves it to torch, whose default of True refuses some values a
state dict may hold, such as empty `bytes`): the files are the tests' own, and no protocol clause is about
loading restrictions.
Each rank saves its own state to its own file, as a strategy whose ranks hold distinct state would; Lightning's DDP
strategy calls the IO on global rank 0 only, where the clauses about several ranks reduce to one.

Releases before 2.5.4 cannot save after `teardown()` (its executor is shut down for good; #20952, fixed with
`_ensure_setup`): there the saver replaces the AsyncCheckpointIO after each wait(), as a user of that release
must, so that the release is judged on its saves, not on that known bug.
"""

from __future__ import annotations

import glob
import os
from importlib import metadata
from pathlib import Path
from typing import Any

from ckptspec.spec.harness.surface.formats import CheckpointFormat
from ckptspec.spec.harness.surface.manager_api import CheckpointManager
from ckptspec.spec.harness.surface.saver_api import SaveHandle, Saver

NAME = "lightning"
DISTRIBUTION = "pytorch-lightning"
INSTALL = 'pip install "torch==2.13.0" -e ".[test,lightning]"'
MODULES: dict[str, str] = {}
PACKAGES = ("pytorch_lightning",)
CAPABILITIES = frozenset({"protocol", "manager", "manager_retention"})
EXPECTATIONS = str(Path(__file__).with_name("lightning.expectations.toml"))


class TorchSaveFiles(CheckpointFormat):
    """One torch.save file per rank, made whole by a move, read by TorchCheckpointIO.load_checkpoint."""

    name = "torch.save file per rank (Lightning TorchCheckpointIO)"
    loader = "TorchCheckpointIO.load_checkpoint"
    dcp = False
    marker = None
    data_glob = "rank-*.ckpt"

    def data_file(self, location: str, rank: int) -> str:
        return os.path.join(location, f"rank-{rank}.ckpt")

    def committed(self, location: str, world_size: int) -> bool:
        return all(os.path.isfile(self.data_file(location, rank)) for rank in range(world_size))

    def load(self, location: str, template: dict[str, Any]) -> dict[str, Any]:
        import inspect

        from pytorch_lightning.plugins.io import TorchCheckpointIO

        io = TorchCheckpointIO()
        options = {"weights_only": False} if "weights_only" in inspect.signature(io.load_checkpoint).parameters else {}

        files = sorted(glob.glob(os.path.join(location, self.data_glob)))
        if not files:
            raise FileNotFoundError(f"no {self.data_glob} file in {location}")
        merged: dict[str, Any] = {}
        for file in files:
            merged.update(io.load_checkpoint(file, **options))
        missing = sorted(set(template) - set(merged))
        if missing:
            raise KeyError(f"keys {missing} are in no file of {location}: {[os.path.basename(f) for f in files]}")
        return {key: merged[key] for key in template}


FORMAT = TorchSaveFiles()


def _ends_at_teardown() -> bool:
    """Whether this release's teardown() ends its AsyncCheckpointIO for good (before 2.5.4, #20952)."""
    parts = metadata.version(DISTRIBUTION).split(".")[:3]
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts) < (2, 5, 4)


class _LightningHandle(SaveHandle):
    def __init__(self, saver: LightningSaver):
        self.saver = saver

    def wait(self) -> None:
        import torch.distributed as dist

        self.saver.teardown()
        if dist.is_initialized():
            dist.barrier()  # every rank's file is written (the checkpoint of several ranks is complete)


class LightningSaver(Saver):
    """One AsyncCheckpointIO(TorchCheckpointIO()), kept across saves as a Trainer keeps its plugin."""

    def __init__(self) -> None:
        self.io = self._new_io()
        self.renew = _ends_at_teardown()

    @staticmethod
    def _new_io() -> Any:
        from pytorch_lightning.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

        return AsyncCheckpointIO(TorchCheckpointIO())

    def start(self, state_dict: dict[str, Any], path: str) -> SaveHandle:
        import torch.distributed as dist

        rank = dist.get_rank() if dist.is_initialized() else 0
        self.io.save_checkpoint(state_dict, FORMAT.data_file(path, rank))
        if dist.is_initialized():
            dist.barrier()  # Trainer.save_checkpoint's barrier after strategy.save_checkpoint
        return _LightningHandle(self)

    def teardown(self) -> None:
        try:
            self.io.teardown()
        finally:
            if self.renew:
                self.io = self._new_io()

    def close(self) -> None:
        self.teardown()


def protocol_saver(**options: Any) -> LightningSaver:
    """A new saver; Lightning has one kind of caller, so every option is ignored."""
    return LightningSaver()


def checkpoint_manager(root: str, keep: int) -> CheckpointManager:
    """A Trainer's ModelCheckpoint with AsyncCheckpointIO over `root` (ckptspec.spec.targets._lightning_manager)."""
    from ckptspec.spec.targets._lightning_manager import LightningManager

    return LightningManager(root, keep)
