"""Adapter for the transformers `Trainer`'s checkpoints (transformers 5.23.0): its `checkpoint-<N>` folders,
`save_total_limit` and `resume_from_checkpoint=True`, through the manager layer only; written against the documented
adapter contract (ckptspec.spec.harness.surface.contract), as an outside author would.

What transformers offers: no asynchronous save (the Trainer saves synchronously, inside the training loop), but the
manager every fine-tuning user runs: `TrainingArguments(save_strategy, save_steps, save_total_limit)` ("Maximum
number of checkpoints to keep. Deletes older checkpoints in `output_dir`", training_args.py), resume through
`train(resume_from_checkpoint=True)`, which takes `trainer_utils.get_last_checkpoint(output_dir)`, and a save on
SIGTERM (`TrainingArguments(enable_jit_checkpoint=True)`, capability "manager_sigterm_save"). There is no protocol saver: the five protocol calls have no per-save handle to
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

The save on SIGTERM (MG-TERM-2): with `enable_jit_checkpoint=True` the Trainer's constructor adds a
`JITCheckpointCallback` (trainer.py:588-592), whose `set_trainer` installs a SIGTERM handler (signal.signal,
trainer_jit_checkpoint.py:27-29). The handler saves nothing: it starts a `threading.Timer(kill_wait=3)` that then
sets `is_checkpoint_requested` (trainer_jit_checkpoint.py:31-40); the training loop's next callback hook among
on_step_begin, on_pre_optimizer_step, on_step_end and on_epoch_end (trainer_jit_checkpoint.py:99-119) sets
`control.should_training_stop` and runs `execute_jit_checkpoint`: a `checkpoint-is-incomplete.txt` sentinel, then the
same `_save_checkpoint` as a save step, of `checkpoint-<state.global_step>`, then the sentinel removed
(trainer_jit_checkpoint.py:42-76). The loop then ends (trainer.py:1963-1966, 1673) and train() returns.

- enable_save_on_sigterm(): a new Trainer, made as above with `enable_jit_checkpoint=True` and `disable_tqdm=True`
  (the progress bar is made by train(), which the adapter does not run; PrinterCallback needs none), its
  `state.max_steps` set beyond any test's step (train() sets it from the run's length, TrainerState.compute_steps;
  DefaultFlowCallback.on_step_end stops the loop at it).
- advance(step, state): what `Trainer._run_epoch` runs for one step that is not a save step (trainer.py:1887-1949),
  without forward and backward: `callback_handler.on_step_begin`, `on_pre_optimizer_step` (the state still the
  previous step's), then the optimizer step (the stand-in optimizer's state becomes `state`, `state.global_step =
  step`), `on_optimizer_step`, `on_step_end`; it returns `control.should_training_stop`, on which the loop breaks
  (trainer.py:1963). A save made by on_step_begin or on_pre_optimizer_step is of the previous step, whose state the
  stand-in optimizer still holds, as the model does in the loop. `_maybe_log_save_evaluate` is not run: no save is
  due at these steps (the save steps are save()).

The configuration judged: one, the Trainer's defaults with a save every step and `save_total_limit` the test's
`keep`; there is no configuration variable, since transformers has no asynchronous save to recommend.
`enable_jit_checkpoint` is left at its default (off) except after enable_save_on_sigterm(): it changes only what
happens on SIGTERM, which only MG-TERM-2's test sends with it on (MG-TERM-1's trainer has it off, as by default).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

from ckptspec.spec.harness.surface.manager_api import CheckpointManager

NAME = "transformers"
DISTRIBUTION = "transformers"
INSTALL = 'pip install "torch==2.13.0" -e ".[test,transformers]"'
MODULES: dict[str, str] = {}
PACKAGES = ("transformers", "accelerate")
# No manager_ranks: optimizer.pt is written by the process that should_save (rank 0) alone.
CAPABILITIES = frozenset({"manager", "manager_retention", "manager_sigterm_save"})
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
        self.root, self.keep = root, keep
        self.trainer = self._trainer()

    def _trainer(self, **options: Any) -> Any:
        """A Trainer over a new one-layer model and stand-in optimizer, with `options` added to its arguments."""
        import torch
        from transformers import Trainer, TrainingArguments

        args = TrainingArguments(
            output_dir=self.root,
            save_strategy="steps",
            save_steps=1,
            save_total_limit=self.keep or None,
            use_cpu=True,
            report_to=[],
            **options,
        )
        model = torch.nn.Linear(2, 2)
        self.optimizer = _optimizer(model.parameters())
        scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, lambda _: 1.0)
        return Trainer(model=model, args=args, optimizers=(self.optimizer, scheduler))

    def enable_save_on_sigterm(self) -> None:
        self.trainer = self._trainer(enable_jit_checkpoint=True, disable_tqdm=True)
        self.trainer.state.max_steps = sys.maxsize

    def advance(self, step: int, state_dict: dict[str, Any]) -> bool:
        trainer = self.trainer
        hooks, args = trainer.callback_handler, trainer.args
        trainer.control = hooks.on_step_begin(args, trainer.state, trainer.control)
        trainer.control = hooks.on_pre_optimizer_step(args, trainer.state, trainer.control)
        self.optimizer.ckptspec = state_dict  # the optimizer step
        trainer.state.global_step = step
        trainer.control = hooks.on_optimizer_step(args, trainer.state, trainer.control)
        trainer.control = hooks.on_step_end(args, trainer.state, trainer.control)
        return bool(trainer.control.should_training_stop)

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
