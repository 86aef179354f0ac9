"""Adapter for the transformers `Trainer`'s checkpoints (transformers 5.23.0): its `checkpoint-<N>` folders,
`save_total_limit` and `resume_from_checkpoint=True`, through the manager layer only; written against the documented
adapter contract (ckptspec.spec.harness.surface.contract), as an outside author would.

What transformers offers: no asynchronous save (the Trainer saves synchronously, inside the training loop), but the
manager every fine-tuning user runs: `TrainingArguments(save_strategy, save_steps, save_total_limit)` ("Maximum
number of checkpoints to keep. Deletes older checkpoints in `output_dir`", training_args.py), resume through
`train(resume_from_checkpoint=True)`, which takes `trainer_utils.get_last_checkpoint(output_dir)`, and a save on
SIGTERM (`enable_jit_checkpoint`). There is no protocol saver: the five protocol calls have no per-save handle to
map to (capability "protocol" is not declared).

The manager calls: a `Trainer` over a one-layer model, `TrainingArguments(output_dir=root, save_strategy="steps",
save_steps=1, save_total_limit=keep or None, use_cpu=True, report_to=[])`, and a stand-in optimizer whose
`state_dict()` is the test's state dict (so the state travels in `optimizer.pt`, which
`_save_optimizer_and_scheduler` writes with torch.save on the process that `should_save`, and
`_load_optimizer_and_scheduler` reads back with `torch.load(..., weights_only=True)`).

- save(step, state): `state.global_step = step`, then `Trainer._save_checkpoint(model, trial=None)`, what the
  training loop calls at a save step (`_maybe_log_save_evaluate`): `save_model` (model.safetensors), optimizer.pt,
  scheduler.pt, rng_state.pth, trainer_state.json, then `rotate_checkpoints(save_total_limit, use_mtime=True)`
  (trainer.py:3355-3422), all into `<root>/checkpoint-<step>` directly (no temporary name, no fsync).
- wait(): nothing (the save returned complete).
- latest(): `get_last_checkpoint(root)` (trainer_utils.py:270-279), exactly what `train(resume_from_checkpoint=True)`
  resolves (trainer.py:1554-1557): the highest `checkpoint-<N>` directory, complete or not.
- resume(template): that folder, its step read from its trainer_state.json (`TrainerState.load_from_json`, as
  train() resumes `global_step`), the state through `_load_optimizer_and_scheduler`.
- pointer: None (resume scans). Retention: save_total_limit, whose deletions happen in the save itself.

The configuration judged: one, the Trainer's defaults with a save every step and `save_total_limit` the test's
`keep`; there is no configuration variable, since transformers has no asynchronous save to recommend.
`enable_jit_checkpoint` changes only when a save is made (on SIGTERM, at the next callback hook), which the manager
calls do not exercise; it is left at its default (off).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ckptspec.spec.harness.surface.manager_api import CheckpointManager

NAME = "transformers"
DISTRIBUTION = "transformers"
INSTALL = 'pip install "torch==2.13.0" -e ".[test,transformers]"'
MODULES: dict[str, str] = {}
PACKAGES = ("transformers", "accelerate")
# No manager_ranks: optimizer.pt is written by the process that should_save (rank 0) alone.
CAPABILITIES = frozenset({"manager", "manager_retention"})
EXPECTATIONS = str(Path(__file__).with_name("transformers.expectations.toml"))


def _optimizer(params: Any) -> Any:
    import torch

    class StateOptimizer(torch.optim.SGD):
        """An optimizer whose checkpointed state is the test's state dict."""

        ckptspec: dict[str, Any]

        def state_dict(self) -> dict[str, Any]:
            return {"ckptspec": self.ckptspec}

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.ckptspec = state_dict["ckptspec"]

    optimizer = StateOptimizer(params, lr=0.0)
    optimizer.ckptspec = {}
    return optimizer


class TrainerManager(CheckpointManager):
    """A Trainer's own checkpoint folders below `root` (see the module docstring)."""

    pointer = None

    def __init__(self, root: str, keep: int):
        import torch
        from transformers import Trainer, TrainingArguments

        self.root = root
        args = TrainingArguments(
            output_dir=root,
            save_strategy="steps",
            save_steps=1,
            save_total_limit=keep or None,
            use_cpu=True,
            report_to=[],
        )
        model = torch.nn.Linear(2, 2)
        self.optimizer = _optimizer(model.parameters())
        scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)
        self.trainer = Trainer(model=model, args=args, optimizers=(self.optimizer, scheduler))

    def save(self, step: int, state_dict: dict[str, Any]) -> None:
        self.optimizer.ckptspec = state_dict
        self.trainer.state.global_step = step
        self.trainer._save_checkpoint(self.trainer.model, trial=None)

    def wait(self) -> None:
        return

    def _last(self) -> str | None:
        from transformers.trainer_utils import get_last_checkpoint

        if not os.path.isdir(self.root):
            return None
        found = get_last_checkpoint(self.root)
        return None if found is None else str(found)

    def latest(self) -> int | None:
        path = self._last()
        match = None if path is None else re.search(r"checkpoint-(\d+)$", path)
        return None if match is None else int(match.group(1))

    def _read(self, path: str, template: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        from transformers.trainer_callback import TrainerState

        step = TrainerState.load_from_json(os.path.join(path, "trainer_state.json")).global_step
        self.trainer._load_optimizer_and_scheduler(path)
        state = self.optimizer.ckptspec
        return int(step), {key: state[key] for key in template}

    def resume(self, template: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        path = self._last()
        return None if path is None else self._read(path, template)

    def load(self, step: int, template: dict[str, Any]) -> dict[str, Any]:
        return self._read(self.location(step), template)[1]

    def location(self, step: int) -> str:
        return os.path.join(self.root, f"checkpoint-{step}")

    def steps(self) -> list[int]:
        if not os.path.isdir(self.root):
            return []
        names = (re.fullmatch(r"checkpoint-(\d+)", n) for n in os.listdir(self.root))
        return sorted(int(m.group(1)) for m in names if m)

    def close(self) -> None:
        return


def checkpoint_manager(root: str, keep: int) -> TrainerManager:
    """A Trainer's checkpoint folders below `root`, save_total_limit=keep (0: None, keep all)."""
    return TrainerManager(root, keep)
