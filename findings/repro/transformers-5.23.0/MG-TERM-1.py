"""MG-TERM-1 on transformers 5.23.0: a job preempted (SIGTERM) during a checkpoint save cannot resume:
`train(resume_from_checkpoint=True)` chooses the half-written checkpoint, although the previous one is intact.

    python findings/repro/transformers-5.23.0/MG-TERM-1.py transformers

Clause (implied, data-loss): if the trainer is sent SIGTERM while a manager save is in flight, before that save
committed, resume afterwards loads the previous committed checkpoint, exactly. Source: `train(resume_from_checkpoint)`:
"If a `bool` and equals `True`, load the last checkpoint in *args.output_dir* as saved by a previous instance of
[`Trainer`]" (trainer.py:1461-1463, the argument's docstring): a folder a killed save left is not a checkpoint "as saved".

Mechanism (transformers/trainer.py `_save_checkpoint`, trainer_utils.py `get_last_checkpoint`): a save writes
straight into `checkpoint-<step>/` (model.safetensors, then optimizer.pt, scheduler.pt, rng_state.pth, then
trainer_state.json), with no temporary folder, rename or marker; `get_last_checkpoint` returns the highest-numbered
`checkpoint-<N>` folder without looking inside it, and `train` reads that folder's trainer_state.json
(trainer.py:1555-1565). The mechanism of issue huggingface/transformers#35782.

One process trains a Linear model for 3 steps with `save_steps=1` (the default `enable_jit_checkpoint=False`: the
Trainer installs no SIGTERM handler) and is sent SIGTERM, as a scheduler preempts a job, once step 3's
model.safetensors is written and before its optimizer.pt; then a new
Trainer resumes with `resume_from_checkpoint=True`. Prints what it saw; exits 1 where the clause is broken, 0 where
it holds, 2 when it could not run.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import shutil
import signal
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


def _killed_at_step_3(output_dir: str) -> None:
    """Train 3 steps; SIGTERM once step 3's model file is on disk, before its optimizer file."""
    warnings.filterwarnings("ignore")
    trainer = _trainer(output_dir, 3)
    save_optimizer = trainer._save_optimizer_and_scheduler

    def optimizer_then_maybe_die(folder: str) -> None:
        if folder.endswith("checkpoint-3"):
            os.kill(os.getpid(), signal.SIGTERM)  # the model file of step 3 is written; nothing after it
        save_optimizer(folder)

    trainer._save_optimizer_and_scheduler = optimizer_then_maybe_die
    trainer.train()


def main() -> int:
    if sys.argv[1:] != ["transformers"]:
        print(f"usage: {sys.argv[0]} transformers", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    tmp = tempfile.mkdtemp(prefix="mg-term-1-")
    try:
        child = mp.get_context("fork").Process(target=_killed_at_step_3, args=(tmp,))
        child.start()
        child.join(300)
        if child.exitcode != -signal.SIGTERM:
            print(f"the training process ended with {child.exitcode}, not by SIGTERM at step 3's save: could not run")
            return 2
        print(f"ended by SIGTERM during step 3's save; the output folder holds: {sorted(os.listdir(tmp))}")
        print(f"checkpoint-3 holds: {sorted(os.listdir(os.path.join(tmp, 'checkpoint-3')))}")
        print(f"checkpoint-2 holds: {sorted(os.listdir(os.path.join(tmp, 'checkpoint-2')))}")
        from transformers.trainer_utils import get_last_checkpoint

        print(f"get_last_checkpoint chooses: {os.path.basename(get_last_checkpoint(tmp))}")
        trainer = _trainer(tmp, 4)
        try:
            trainer.train(resume_from_checkpoint=True)
        except Exception as exc:  # what the resume raised is the finding
            print(f"train(resume_from_checkpoint=True) raised {type(exc).__name__}: {exc}")
            print("BROKEN: resume chose the checkpoint the preempted save left and failed; checkpoint-2 was intact")
            return 1
        print(f"train(resume_from_checkpoint=True) resumed; global_step now {trainer.state.global_step}")
        return 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
