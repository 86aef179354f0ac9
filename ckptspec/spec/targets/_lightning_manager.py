"""Lightning's `ModelCheckpoint` with `AsyncCheckpointIO` behind the manager contract (ckptspec.spec.harness.surface.manager_api),
written against the documented adapter contract, as an outside author would.

A `Trainer` (CPU, one device, `plugins=[AsyncCheckpointIO(TorchCheckpointIO())]`, the callback
`ModelCheckpoint(dirpath=root, filename="{step}", every_n_train_steps=1, save_last=True, ...)`) with a small
LightningModule attached, as `fit` attaches it; the state dict a test saves travels in the checkpoint through the
module's own hooks (`on_save_checkpoint` / `on_load_checkpoint`, key "ckptspec").

- save(step, state): the fit loop's optimizer-step counter is set to `step` (what `trainer.global_step` reads), then
  `ModelCheckpoint.on_train_batch_end` runs as the fit loop calls it after a batch: it saves `step=<N>.ckpt` and
  `last.ckpt` through `trainer.save_checkpoint`, which AsyncCheckpointIO hands to its thread, and applies retention.
- Retention `keep`: keep=1 is Lightning's default, `save_top_k=1` without a monitor (the previous file is removed);
  keep=k >= 2 is `save_top_k=k, monitor="step", mode="max"` (the k highest steps, the k newest); keep=0 is
  `save_top_k=-1` (all).
- wait(): `AsyncCheckpointIO.teardown()`, Lightning's only wait (it raises the error a save stored); on releases
  before 2.5.4 the plugin is then replaced (#20952), as in ckptspec.spec.targets.lightning.
- latest() / resume(template): `ckpt_path="last"` resolved by Lightning's own checkpoint connector
  (`_parse_ckpt_path`), loaded by the strategy (`TorchCheckpointIO.load_checkpoint`), the step its `global_step`.
- load(step, template): `step=<step>.ckpt` through the same loader.
"""

from __future__ import annotations

import os
import re
from importlib import metadata
from typing import Any

from ckptspec.spec.harness.surface.manager_api import CheckpointManager

__all__ = ["LightningManager"]


def _async_io() -> Any:
    from pytorch_lightning.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    return AsyncCheckpointIO(TorchCheckpointIO())


def _ends_at_teardown() -> bool:
    """Whether this release's teardown() ends its AsyncCheckpointIO for good (before 2.5.4, #20952)."""
    parts = metadata.version("pytorch-lightning").split(".")[:3]
    return tuple(int("".join(c for c in p if c.isdigit()) or 0) for p in parts) < (2, 5, 4)


def _module() -> Any:
    import pytorch_lightning as pl
    import torch

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 2)
            self.ckptspec: dict[str, Any] = {}

        def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            checkpoint["ckptspec"] = self.ckptspec

        def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
            self.ckptspec = checkpoint["ckptspec"]

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Module()


class LightningManager(CheckpointManager):
    """A Trainer's ModelCheckpoint + AsyncCheckpointIO over `root` (see the module docstring)."""

    def __init__(self, root: str, keep: int):
        import pytorch_lightning as pl
        from pytorch_lightning.callbacks import ModelCheckpoint
        from pytorch_lightning.trainer.states import TrainerFn

        self.root = root
        retention: dict[str, Any] = {"save_top_k": -1 if keep == 0 else keep}
        if keep >= 2:
            retention.update(monitor="step", mode="max")
        self.callback = ModelCheckpoint(
            dirpath=root, filename="{step}", every_n_train_steps=1, save_last=True, **retention
        )
        self.io = _async_io()
        self.trainer = pl.Trainer(
            default_root_dir=root,
            accelerator="cpu",
            devices=1,
            plugins=[self.io],
            callbacks=[self.callback],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        self.module = _module()
        self.trainer.strategy.connect(self.module)
        self.trainer.state.fn = TrainerFn.FITTING

    def _set_step(self, step: int) -> None:
        progress = self.trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress
        progress.optimizer.step.total.completed = step

    def save(self, step: int, state_dict: dict[str, Any]) -> None:
        self.module.ckptspec = state_dict
        self._set_step(step)
        self.callback.on_train_batch_end(self.trainer, self.module, None, None, 0)

    def wait(self) -> None:
        try:
            self.io.teardown()
        finally:
            if _ends_at_teardown():  # before 2.5.4 a torn-down plugin never saves again (#20952)
                self.io = _async_io()
                self.trainer.strategy.checkpoint_io = self.io

    def _read(self, path: str, template: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        checkpoint = self.trainer.strategy.load_checkpoint(path)
        state = checkpoint["ckptspec"]
        return int(checkpoint["global_step"]), {key: state[key] for key in template}

    def _last(self) -> str | None:
        from pytorch_lightning.trainer.states import TrainerFn

        connector = self.trainer._checkpoint_connector
        path = connector._parse_ckpt_path(TrainerFn.FITTING, "last", model_provided=True, model_connected=True)
        return None if path is None else str(path)

    def latest(self) -> int | None:
        path = self._last()
        return None if path is None else int(self.trainer.strategy.load_checkpoint(path)["global_step"])

    def resume(self, template: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        path = self._last()
        return None if path is None else self._read(path, template)

    def load(self, step: int, template: dict[str, Any]) -> dict[str, Any]:
        return self._read(self.location(step), template)[1]

    def location(self, step: int) -> str:
        return os.path.join(self.root, f"step={step}.ckpt")

    def copies(self, step: int) -> list[str]:
        last = os.path.join(self.root, "last.ckpt")
        held = os.path.exists(last) and int(self.trainer.strategy.load_checkpoint(last)["global_step"]) == step
        return [self.location(step)] + ([last] if held else [])

    def steps(self) -> list[int]:
        if not os.path.isdir(self.root):
            return []
        names = (re.fullmatch(r"step=(\d+)\.ckpt", n) for n in os.listdir(self.root))
        return sorted(int(m.group(1)) for m in names if m)

    def close(self) -> None:
        self.wait()
