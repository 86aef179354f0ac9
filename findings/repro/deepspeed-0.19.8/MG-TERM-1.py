"""MG-TERM-1 on deepspeed 0.19.8 (and 0.18.3): a job preempted (SIGTERM) while `save_checkpoint` rewrites the
`latest` tag file cannot resume, although the previous checkpoint is intact.

    python findings/repro/deepspeed-0.19.8/MG-TERM-1.py deepspeed

Clause (implied, data-loss): if the trainer is sent SIGTERM while a manager save is in flight, before that save
committed, resume afterwards loads the previous committed checkpoint, exactly. Source: `save_checkpoint` docstring (runtime/engine.py): "save_latest:
Optional. Save a file 'latest' pointing to the latest saved checkpoint", and `load_checkpoint`: "tag: Checkpoint
tag used as a unique identifier for checkpoint, if not provided will attempt to load tag in 'latest' file".

Mechanism (deepspeed/runtime/engine.py:4957-4962 in 0.19.8, 3685-3689 in 0.18.3, `save_checkpoint`): global rank 0
publishes the tag with `with open(os.path.join(save_dir, 'latest'), 'w') as fd: fd.write(tag)`. Opening with 'w'
truncates the file first; there is no temporary file, rename or fsync. A SIGTERM (a scheduler's preemption; DeepSpeed
installs no handler) between the truncation and the write leaves `latest` empty; `load_checkpoint(save_dir)` then
reads the empty tag and fails in `check_ckpt_list` (runtime/state_dict_factory.py:168, a bare `assert
len(self.ckpt_list) > 0`).

One process, a world of one rank (gloo, DS_ACCELERATOR=cpu on a machine without CUDA): global_step1 and
global_step2 are saved; the save of global_step3 is ended by SIGTERM right after `latest` was opened for writing,
the point a preemption lands in when it arrives during that write. A new engine then resumes with
`load_checkpoint(save_dir)`. Prints what it saw; exits 1 where the clause is broken, 0 where it holds, 2 when it
could not run.
"""

from __future__ import annotations

import atexit
import builtins
import multiprocessing as mp
import os
import shutil
import signal
import socket
import sys
import tempfile
import warnings
from pathlib import Path

# Run from a directory findings/repro/deepspeed-decoupled-<release>/ (a link to this file), it judges the decoupled engine
# (`{"checkpoint": {"writer": {"decoupled": true}}}`), whose commit writes `latest` the same way (engine.py:4978-4980).
DECOUPLED = Path(__file__).parent.name.startswith("deepspeed-decoupled")


def _engine(port: int):
    import torch
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("CROSS_SIZE", "1")
    os.environ.setdefault("CROSS_RANK", "0")
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
    import deepspeed

    model = torch.nn.Linear(2, 2)
    config = {"train_batch_size": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    if DECOUPLED:
        # The decoupled engine; in a plain data-parallel job (no Megatron mpu) it needs "data_parallel" set
        # (model_checkpointing/data_parallel_writer_factory.py:95 reads a dp_rank that UniversalParallelInfo lacks),
        # and its python writer on a machine without CUDA (the default "fast" one pins memory).
        writer = {"decoupled": True, "data_parallel": "replica"}
        if not torch.cuda.is_available():
            writer["type"] = "python"
        config["checkpoint"] = {"writer": writer}
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    return engine


def _save(engine, save_dir: str, tag: str, step: int) -> None:
    """save_checkpoint, then (decoupled engine) the commit engine.step() makes at its next boundary."""
    engine.save_checkpoint(save_dir, tag=tag, client_state={"step": step})
    if engine.checkpoint_engine.is_decoupled():
        engine._commit_decoupled_checkpoint()


def _save_then_die(save_dir: str, port: int, writer_pid) -> None:
    warnings.filterwarnings("ignore")
    engine = _engine(port)
    if engine.checkpoint_engine.is_decoupled() and engine.checkpoint_engine.ckpt_process is not None:
        writer_pid.value = engine.checkpoint_engine.ckpt_process.pid  # for the parent, once this process ended
    for step in (1, 2):
        _save(engine, save_dir, f"global_step{step}", step)
    real_open = builtins.open

    def open_then_die(file, mode="r", *args, **kwargs):
        handle = real_open(file, mode, *args, **kwargs)
        if str(file).endswith("latest") and "w" in mode:
            os.kill(os.getpid(), signal.SIGTERM)  # `latest` is truncated; its new tag is not written yet
        return handle

    builtins.open = open_then_die
    _save(engine, save_dir, "global_step3", 3)


def _end_orphaned_writer(pid: int) -> None:
    """The decoupled engine's writer process of the trainer that ended: nothing told it to exit (only the engine's
    cleanup(), from destroy() or its __del__, puts the EXIT_EVENT it waits for, decoupled_checkpoint_engine.py:62-64),
    so it waits in save_queue.get() for ever (line 48), holding this script's output open; ended here."""
    if not pid:
        return
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return
    print("the ended trainer's checkpoint writer process (DeepSpeed's decoupled engine) is still running: ended here")
    os.kill(pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    if sys.argv[1:] != ["deepspeed"]:
        print(f"usage: {sys.argv[0]} deepspeed", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    save_dir = tempfile.mkdtemp(prefix="ds-mg-term-1-")
    try:
        context = mp.get_context("spawn")
        writer_pid = context.Value("i", 0)
        child = context.Process(target=_save_then_die, args=(save_dir, _free_port(), writer_pid))
        child.start()
        child.join(600)
        _end_orphaned_writer(writer_pid.value)
        if child.exitcode != -signal.SIGTERM:
            print(f"the saving process ended with {child.exitcode}, not by SIGTERM in the save of global_step3")
            return 2
        with open(os.path.join(save_dir, "latest")) as f:
            pointer = f.read()
        print(
            f"ended by SIGTERM while writing `latest`; save_dir holds {sorted(os.listdir(save_dir))}; latest = {pointer!r}"
        )
        engine = _engine(_free_port())
        # destroy() ends the decoupled engine's writer: a non-daemonic process that interpreter exit would otherwise
        # join for ever (multiprocessing's exit hook runs before the engine is collected). Registered after
        # multiprocessing's hook, so it runs first.
        atexit.register(engine.destroy)
        _, kept = engine.load_checkpoint(save_dir, tag="global_step2")
        print(f"load_checkpoint(save_dir, tag='global_step2') -> step {kept and kept.get('step')} (intact)")
        try:
            path, client_state = engine.load_checkpoint(save_dir)
        except Exception as exc:  # what the resume raised is the finding
            print(f"load_checkpoint(save_dir) raised {type(exc).__name__}: {exc}")
            print("BROKEN: resume cannot load anything, although global_step2 is intact on disk")
            return 1
        print(f"load_checkpoint(save_dir) -> {path!r}")
        if path is None:
            print("BROKEN: resume found no checkpoint, although global_step2 is intact on disk")
            return 1
        print(f"resumed step {client_state.get('step')}")
        return 0
    finally:
        shutil.rmtree(save_dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
