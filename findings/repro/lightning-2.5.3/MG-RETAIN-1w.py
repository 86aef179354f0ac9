"""MG-RETAIN-1w on pytorch-lightning 2.6.6 and 2.5.3: ModelCheckpoint deletes the previous checkpoint before the asynchronous
save that replaces it is written; when that save fails, no checkpoint is left.

    python findings/repro/lightning-2.6.6/MG-RETAIN-1w.py pytorch_lightning   (the same file for 2.5.3)

Clause (implied, data-loss): while a save is in flight, and after it failed, the newest checkpoint committed before
it still loads. Source: ModelCheckpoint(save_top_k): 'if ``save_top_k == k``, the best k models according to the
quantity monitored will be saved.' A save that never completed is not one of them, so the one it displaced is.

Mechanism (pytorch_lightning/callbacks/model_checkpoint.py): `_save_none_monitor_checkpoint` (the default
`save_top_k=1`, no monitor) calls `trainer.save_checkpoint(new)`, which with `AsyncCheckpointIO` only submits the
write to a thread, then at once `_remove_checkpoint(trainer, previous)`. The write's error surfaces later, at
`teardown()`, when the previous file is gone. (A write that fails at once may instead be raised by
`save_checkpoint` itself, before the removal: `AsyncCheckpointIO` re-raises a stored error right after submitting,
so an instant failure can win the race; a large write that runs out of space part-way does not.)

A real `Trainer.fit` of two steps on the CPU (`every_n_train_steps=1`, `save_top_k=1`, the documented
`plugins=[AsyncCheckpointIO()]`), over a `TorchCheckpointIO` whose write of step 2 fails as a full disk does
(OSError ENOSPC, raised in the plugin's thread): step 1 is saved (its file is on disk before step 2's training step
ends, as a small save's is), then step 2's save fails. Prints what is left;
exits 1 where the clause is broken (nothing loadable), 0 where step 1's checkpoint survives, 2 when it could not run.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import sys
import tempfile
import time
import warnings

import torch


def _appears(path: str, bound: float = 10.0) -> bool:
    deadline = time.monotonic() + bound
    while not os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.01)
    return os.path.exists(path)


def main() -> int:
    if sys.argv[1:] != ["pytorch_lightning"]:
        print(f"usage: {sys.argv[0]} pytorch_lightning", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    logging.getLogger("pytorch_lightning").setLevel(logging.ERROR)
    import pytorch_lightning as pl
    from pytorch_lightning.callbacks import ModelCheckpoint
    from pytorch_lightning.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    class FullDiskAtStep2(TorchCheckpointIO):
        """Step 2's write runs out of space part-way, as a large write does: it fails once the trainer has gone on
        (here: once step 1's file is gone, or after 10 s where nothing removes it)."""

        def save_checkpoint(self, checkpoint, path, storage_options=None):
            if checkpoint["global_step"] == 2:
                previous = os.path.join(os.path.dirname(str(path)), "step=1.ckpt")
                deadline = time.monotonic() + 10.0
                while os.path.exists(previous) and time.monotonic() < deadline:
                    time.sleep(0.01)
                raise OSError(errno.ENOSPC, "No space left on device (simulated)", str(path))
            super().save_checkpoint(checkpoint, path, storage_options)

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            if batch_idx == 1:  # a training step outlasts a small save: step 1's file is written before step 2 ends
                _appears(os.path.join(tmp, "step=1.ckpt"))
            return self.layer(batch).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

        def train_dataloader(self):
            return torch.utils.data.DataLoader(torch.ones(8, 2), batch_size=1)

    tmp = tempfile.mkdtemp(prefix="repro-lightning-")
    try:
        checkpoint = ModelCheckpoint(dirpath=tmp, filename="{step}", every_n_train_steps=1, save_top_k=1)
        trainer = pl.Trainer(
            max_steps=2,
            accelerator="cpu",
            devices=1,
            callbacks=[checkpoint],
            plugins=[AsyncCheckpointIO(FullDiskAtStep2())],
            logger=False,
            enable_progress_bar=False,
            enable_model_summary=False,
        )
        try:
            trainer.fit(Tiny())
            print("fit() returned")
        except OSError as exc:
            print(f"fit() raised: {type(exc).__name__}: {exc}")
        left = sorted(os.listdir(tmp))
        print(f"checkpoints left in the directory: {left}")
        if "step=1.ckpt" in left:
            print("HOLDS: step 1's checkpoint survived the failed save of step 2")
            return 0
        print("BROKEN: step 1's checkpoint was deleted before step 2's save was written, and step 2's save failed")
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
