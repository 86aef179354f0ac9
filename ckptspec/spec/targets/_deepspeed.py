"""DeepSpeed's `DeepSpeedEngine.save_checkpoint` / `load_checkpoint` behind the protocol and manager layers (the
adapter `deepspeed`, ckptspec.spec.targets.deepspeed, says what is judged). Written against the documented adapter
contract (ckptspec.spec.harness.surface.contract), as an outside author would.

The engine is built as a user builds it: `deepspeed.initialize(model=nn.Linear(2, 2), model_parameters=...,
config=...)` over the process group the test already made (DeepSpeed wraps an initialised torch.distributed), ZeRO
stage 0, SGD. The test's state dict travels as `client_state`, DeepSpeed's channel for "saving required training
states in the client code" (save_checkpoint's docstring): `_save_checkpoint` merges it into the model-states dict
that data-parallel rank 0 writes (`<save_dir>/<tag>/mp_rank_00_model_states.pt`), and `load_checkpoint` returns it.

The two configurations (CKPTSPEC_DEEPSPEED_CONFIG, `configuration()`):

- "default": `TorchCheckpointEngine` (no "checkpoint" section): save_checkpoint writes synchronously and writes
  `latest` before it returns; the commit in wait() has nothing to do.
- "decoupled": `{"checkpoint": {"writer": {"type": "python", "decoupled": true, "data_parallel": "replica"}}}`.
  `DecoupledCheckpointEngine` starts one writer process per writing rank (torch.multiprocessing, spawn) and `save()`
  puts `(state_dict, path)` on an `mp.SimpleQueue`; `save_checkpoint` then returns without writing `latest`. The
  commit is `engine._commit_decoupled_checkpoint()`, which `engine.step()` calls at the next gradient-accumulation
  boundary: `commit()` waits for the writer's event, then rank 0 writes `latest` and all ranks meet at a barrier.
  wait() makes that call (exactly what step() calls, without an optimizer step on the stand-in model).

The format (FORMAT): one `torch.save` file per checkpoint at ZeRO stage 0, `mp_rank_00_model_states.pt`, written in
place (no temporary name, no rename, no fsync); the commit of a tag is the `latest` file beside the tag directory
naming it (`load_checkpoint` with tag=None loads only what `latest` names). Read back with DeepSpeed's
`TorchCheckpointEngine.load` (torch.load, weights_only=False), the client_state keys at the top level.
"""

from __future__ import annotations

import os
import re
from typing import Any

import torch

from ckptspec.spec.harness.surface.formats import CheckpointFormat
from ckptspec.spec.harness.surface.manager_api import CheckpointManager
from ckptspec.spec.harness.surface.saver_api import SaveHandle, Saver

__all__ = ["CONFIG_VAR", "FORMAT", "DeepSpeedManager", "DeepSpeedSaver", "ModelStatesFile", "configuration", "set_up"]

MODEL_FILE = "mp_rank_00_model_states.pt"
POINTER = "latest"
CONFIG_VAR = "CKPTSPEC_DEEPSPEED_CONFIG"
CONFIGURATIONS = ("default", "decoupled")


def set_up() -> None:
    """CPU accelerator where there is no CUDA; the launcher's machine variables where a job did not set them."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("CROSS_SIZE", "1")
    os.environ.setdefault("CROSS_RANK", "0")
    os.environ.setdefault("LOCAL_RANK", os.environ.get("RANK", "0"))


def configuration() -> str:
    """The configuration judged: $CKPTSPEC_DEEPSPEED_CONFIG, "default" (unset) or "decoupled"."""
    kind = os.environ.get(CONFIG_VAR) or "default"
    if kind not in CONFIGURATIONS:
        raise ValueError(f"{CONFIG_VAR} must be one of {', '.join(CONFIGURATIONS)}, not {kind!r}")
    return kind


def _config(kind: str) -> dict[str, Any]:
    import torch.distributed as dist

    world = dist.get_world_size() if dist.is_initialized() else 1
    config: dict[str, Any] = {"train_batch_size": world, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    if kind == "decoupled":
        config["checkpoint"] = {"writer": {"type": "python", "decoupled": True, "data_parallel": "replica"}}
    return config


def _engine(kind: str) -> Any:
    import deepspeed

    set_up()
    model = torch.nn.Linear(2, 2)
    engine, *_ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=_config(kind))
    return engine


def _commit(engine: Any) -> None:
    """What engine.step() does at a gradient-accumulation boundary for a decoupled engine; nothing otherwise."""
    if engine.checkpoint_engine.is_decoupled():
        engine._commit_decoupled_checkpoint()


class ModelStatesFile(CheckpointFormat):
    """`<tag>/mp_rank_00_model_states.pt` (written by data-parallel rank 0, in place), committed by `latest`."""

    name = "DeepSpeed model states file (ZeRO stage 0), committed by the `latest` tag file"
    loader = "TorchCheckpointEngine.load"
    dcp = False
    marker = None
    data_glob = "mp_rank_*_model_states.pt"

    def data_file(self, location: str, rank: int) -> str:
        # ZeRO stage 0: only data-parallel rank 0 writes; every rank's data lies in that one file (the decoupled
        # engine with data_parallel "replica" makes every rank write that same path).
        return os.path.join(location, MODEL_FILE)

    def committed(self, location: str, world_size: int) -> bool:
        pointer = os.path.join(os.path.dirname(location), POINTER)
        if not os.path.isfile(pointer) or not os.path.isfile(os.path.join(location, MODEL_FILE)):
            return False
        with open(pointer) as fd:
            return fd.read().strip() == os.path.basename(location)

    def load(self, location: str, template: dict[str, Any]) -> dict[str, Any]:
        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

        checkpoint = TorchCheckpointEngine().load(os.path.join(location, MODEL_FILE), map_location="cpu")
        missing = sorted(set(template) - set(checkpoint))
        if missing:
            raise KeyError(
                f"keys {missing} are not in {MODEL_FILE} of {location} (client_state of the rank that wrote it)"
            )
        return {key: checkpoint[key] for key in template}


FORMAT = ModelStatesFile()


class _DeepSpeedHandle(SaveHandle):
    def __init__(self, saver: DeepSpeedSaver, number: int):
        self.saver, self.number = saver, number

    def wait(self) -> None:
        if self.saver.saves == self.number:  # an earlier save was committed when the next one started
            _commit(self.saver.engine)


class DeepSpeedSaver(Saver):
    """One DeepSpeedEngine, kept across saves; a checkpoint at `path` is `save_dir=dirname(path)`, `tag=basename`."""

    def __init__(self, kind: str):
        self.engine = _engine(kind)
        self.saves = 0

    def start(self, state_dict: dict[str, Any], path: str) -> SaveHandle:
        _commit(self.engine)  # a save still uncommitted is committed by the step a trainer makes before the next one
        self.engine.save_checkpoint(os.path.dirname(path), tag=os.path.basename(path), client_state=state_dict)
        self.saves += 1
        return _DeepSpeedHandle(self, self.saves)

    def close(self) -> None:
        try:
            _commit(self.engine)
        finally:
            self.engine.destroy()  # DecoupledCheckpointEngine.cleanup(): EXIT_EVENT, then join the writer


class DeepSpeedManager(CheckpointManager):
    """DeepSpeed's own checkpoint directory: `<root>/global_step<N>/`, the `latest` tag file, `load_checkpoint`.

    - save(step, state): `save_checkpoint(root, tag=f"global_step{step}", client_state=state)` (the tag DeepSpeed
      gives by default, `global_step{self.global_steps}`).
    - wait(): the decoupled commit (`latest` written by rank 0 after its own writer finished), or nothing.
    - latest(): the tag `latest` names; resume(template): `load_checkpoint(root)` (tag None: `latest`'s), whose
      client_state is the state; load(step): `load_checkpoint(root, tag=...)`.
    - Retention: DeepSpeed has none; keep > 0 raises ValueError.
    """

    def __init__(self, root: str, keep: int, kind: str):
        if keep:
            raise ValueError(f"DeepSpeed has no checkpoint retention (keep={keep}): every tag is kept")
        self.root = root
        self.pointer = os.path.join(root, POINTER)
        self.engine = _engine(kind)

    def save(self, step: int, state_dict: dict[str, Any]) -> None:
        _commit(self.engine)
        self.engine.save_checkpoint(self.root, tag=f"global_step{step}", client_state=state_dict)

    def wait(self) -> None:
        _commit(self.engine)

    def latest(self) -> int | None:
        pointer = os.path.join(self.root, POINTER)
        if not os.path.isfile(pointer):
            return None
        with open(pointer) as fd:
            match = re.fullmatch(r"global_step(\d+)", fd.read().strip())
        return None if match is None else int(match.group(1))

    def _load(self, tag: str | None, template: dict[str, Any]) -> tuple[str | None, dict[str, Any]]:
        path, client_state = self.engine.load_checkpoint(self.root, tag=tag)
        if path is None:
            return None, {}
        missing = sorted(set(template) - set(client_state))
        if missing:
            raise KeyError(f"keys {missing} are not in the client_state of {path}")
        return path, {key: client_state[key] for key in template}

    def resume(self, template: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        step = self.latest()
        if step is None:
            return None
        path, state = self._load(None, template)
        return None if path is None else (step, state)

    def load(self, step: int, template: dict[str, Any]) -> dict[str, Any]:
        path, state = self._load(f"global_step{step}", template)
        if path is None:
            raise FileNotFoundError(f"DeepSpeed loaded no checkpoint for global_step{step} in {self.root}")
        return state

    def location(self, step: int) -> str:
        return os.path.join(self.root, f"global_step{step}")

    def steps(self) -> list[int]:
        if not os.path.isdir(self.root):
            return []
        names = (re.fullmatch(r"global_step(\d+)", n) for n in os.listdir(self.root))
        return sorted(int(m.group(1)) for m in names if m)

    def close(self) -> None:
        try:
            _commit(self.engine)
        finally:
            self.engine.destroy()
