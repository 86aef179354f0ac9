"""MG-FAIL-1 on transformers 5.23.0: a save that fails on a full disk leaves a checkpoint folder that
`train(resume_from_checkpoint=True)` chooses and cannot load, although the previous checkpoint is intact.

    python findings/repro/transformers-5.23.0/MG-FAIL-1.py transformers

Clause (implied, data-loss): if a manager save meets a storage error at any of its persistence points, resume
afterwards loads the new checkpoint if the save reported success, and otherwise the previous or the new one. Source: `train(resume_from_checkpoint)`:
"If a `bool` and equals `True`, load the last checkpoint in *args.output_dir* as saved by a previous instance of
[`Trainer`]" (trainer.py:1461-1463, the argument's docstring): a folder a killed save left is not a checkpoint "as saved".

Mechanism (transformers/trainer.py `_save_checkpoint`, trainer_utils.py `get_last_checkpoint`): a save writes
straight into `checkpoint-<step>/` (model.safetensors, then optimizer.pt, scheduler.pt, rng_state.pth, then
trainer_state.json), with no temporary folder, rename or marker; `get_last_checkpoint` returns the highest-numbered
`checkpoint-<N>` folder without looking inside it, and `train` reads that folder's trainer_state.json
(trainer.py:1555-1565). The mechanism of issue huggingface/transformers#35782.

One process trains a Linear model for 3 steps with `save_steps=1`; in step 3's save the write of trainer_state.json
fails with ENOSPC, as on a full disk (TrainerState.save_to_json raises it; the training stops with that error); then a new
Trainer resumes with `resume_from_checkpoint=True`. Prints what it saw; exits 1 where the clause is broken, 0 where
it holds, 2 when it could not run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import sys
import tempfile
import warnings


def _trainer(output_dir: str, max_steps: int):
    import torch
    from transformers import Trainer, TrainingArguments

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def forward(self, x, labels=None):
            loss = ((self.layer(x).squeeze(-1) - labels) ** 2).mean()
            return {"loss": loss}

    data = [{"x": torch.tensor([float(i), 1.0]), "labels": torch.tensor(float(i))} for i in range(8)]
    args = TrainingArguments(
        output_dir=output_dir,
        max_steps=max_steps,
        per_device_train_batch_size=2,
        save_strategy="steps",
        save_steps=1,
        report_to=[],
        use_cpu=True,
        disable_tqdm=True,
        logging_strategy="no",
    )
    return Trainer(model=Tiny(), args=args, train_dataset=data)


def _full_disk_at_step_3(output_dir: str) -> None:
    """Train 3 steps; step 3's trainer_state.json cannot be written (ENOSPC)."""
    import errno

    from transformers.trainer_callback import TrainerState

    warnings.filterwarnings("ignore")
    trainer = _trainer(output_dir, 3)
    save_to_json = TrainerState.save_to_json

    def full_disk_at_step_3(self, json_path: str) -> None:
        if os.path.basename(os.path.dirname(json_path)) == "checkpoint-3":
            raise OSError(errno.ENOSPC, "No space left on device (simulated)", json_path)
        save_to_json(self, json_path)

    TrainerState.save_to_json = full_disk_at_step_3
    try:
        trainer.train()
    except OSError as exc:
        print(f"training stopped: {type(exc).__name__}: {exc}", flush=True)
        os._exit(3)
    os._exit(0)


def main() -> int:
    if sys.argv[1:] != ["transformers"]:
        print(f"usage: {sys.argv[0]} transformers", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    tmp = tempfile.mkdtemp(prefix="mg-fail-1-")
    try:
        child = mp.get_context("fork").Process(target=_full_disk_at_step_3, args=(tmp,))
        child.start()
        child.join(300)
        if child.exitcode != 3:
            print(f"the training process ended with {child.exitcode}, not on step 3's failed save: could not run")
            return 2
        print(f"step 3's save failed; the output folder holds: {sorted(os.listdir(tmp))}")
        print(f"checkpoint-3 holds: {sorted(os.listdir(os.path.join(tmp, 'checkpoint-3')))}")
        print(f"checkpoint-2 holds: {sorted(os.listdir(os.path.join(tmp, 'checkpoint-2')))}")
        from transformers.trainer_utils import get_last_checkpoint

        print(f"get_last_checkpoint chooses: {os.path.basename(get_last_checkpoint(tmp))}")
        trainer = _trainer(tmp, 4)
        try:
            trainer.train(resume_from_checkpoint=True)
        except Exception as exc:  # what the resume raised is the finding
            print(f"train(resume_from_checkpoint=True) raised {type(exc).__name__}: {exc}")
            print("BROKEN: resume chose the checkpoint the failed save left and failed; checkpoint-2 was intact")
            return 1
        print(f"train(resume_from_checkpoint=True) resumed; global_step now {trainer.state.global_step}")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
