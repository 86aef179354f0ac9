"""DeepSpeed's `DeepSpeedEngine.save_checkpoint` / `load_checkpoint` behind the protocol and manager layers (the
adapters `deepspeed` and `deepspeed-decoupled` say what each judges). Written against the documented adapter
contract (ckptspec.spec.harness.surface.contract), as an outside author would.

Each rank's state goes where DeepSpeed writes one file per rank. The protocol's state dicts are sharded: every rank
holds keys of its own (`r<rank>`), as a tensor-parallel shard does. DeepSpeed writes per-rank model-states files for
model-parallel ranks (`<tag>/mp_rank_<mp>_model_states.pt`, engine.py `_get_ckpt_name`), and within a data-parallel
group only its rank 0 writes (client_state is replicated state). So the engine is built as a Megatron-DeepSpeed job
builds it: `deepspeed.initialize(model=..., config=..., mpu=mpu)` with an mpu (`_EveryRankItsOwnShard`) in which every
rank is a model-parallel rank of its own and each data-parallel group has one member; each rank then writes its own
`mp_rank_<rank>_model_states.pt`, and the test's state travels as `client_state`, DeepSpeed's channel for "saving
required training states in the client code" (save_checkpoint's docstring), merged by `_save_checkpoint` into that
rank's model-states dict and returned by `load_checkpoint`. Model nn.Linear(2, 2), ZeRO stage 0, SGD.

The two configurations, one builder (`build_engine(writer)`, the writer config each adapter names as `WRITER`):

- default (`WRITER = None`): `TorchCheckpointEngine` (no "checkpoint" section): save_checkpoint writes synchronously
  and writes `latest` before it returns; the commit in wait() has nothing to do.
- decoupled (`WRITER = DECOUPLED`): `{"checkpoint": {"writer": {"decoupled": true}}}`, the documented switch, with
  `"type": "python"` on a machine without CUDA (`engine_config`).
  `DecoupledCheckpointEngine` starts one writer process per writing rank (torch.multiprocessing) and `save()` puts
  `(state_dict, path)` on an `mp.SimpleQueue` (decoupled_checkpoint_engine.py:157-166); `save_checkpoint` then
  returns without writing `latest`. The commit is `engine._commit_decoupled_checkpoint()` (engine.py:4968-4982),
  which `engine.step()` calls at the next gradient-accumulation boundary: `commit()` waits for this rank's writer,
  then global rank 0 writes `latest` and all ranks meet at a barrier. wait() makes that call (exactly what step()
  calls, without an optimizer step on the stand-in model).

The format (FORMAT): one `torch.save` file per model-parallel rank, `mp_rank_<rank:02d>_model_states.pt`, written in
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

__all__ = [
    "DECOUPLED",
    "FORMAT",
    "DeepSpeedManager",
    "DeepSpeedSaver",
    "ModelStatesFiles",
    "build_engine",
    "engine_config",
    "set_up",
]

POINTER = "latest"


def model_file(rank: int) -> str:
    """The model-states file model-parallel rank `rank` writes (engine.py `_get_ckpt_name`, ZeRO stage 0)."""
    return f"mp_rank_{rank:02d}_model_states.pt"


def set_up() -> None:
    """CPU accelerator where there is no CUDA; the launcher's machine variables where a job did not set them."""
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    os.environ.setdefault("CROSS_SIZE", "1")
    os.environ.setdefault("CROSS_RANK", "0")
    os.environ.setdefault("LOCAL_RANK", os.environ.get("RANK", "0"))


class _EveryRankItsOwnShard:
    """A Megatron-style mpu: every rank a tensor-parallel rank of its own (model-parallel world = the world), one
    pipeline stage, data-parallel groups of one. What DeepSpeed reads of an mpu (engine.py, utils/groups.py,
    model_checkpointing/utils.py `_create_model_parallel_info`)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            self.world, self.rank = dist.get_world_size(), dist.get_rank()
            self.model_group = dist.new_group(list(range(self.world)))
            data_groups = [dist.new_group([rank]) for rank in range(self.world)]  # every rank makes every group
            self.data_group = data_groups[self.rank]
        else:
            self.world, self.rank, self.model_group, self.data_group = 1, 0, None, None

    def get_model_parallel_rank(self) -> int:
        return self.rank

    def get_model_parallel_world_size(self) -> int:
        return self.world

    def get_model_parallel_group(self) -> Any:
        return self.model_group

    get_tensor_model_parallel_rank = get_model_parallel_rank
    get_tensor_model_parallel_world_size = get_model_parallel_world_size
    get_tensor_model_parallel_group = get_model_parallel_group

    def get_tensor_model_parallel_src_rank(self) -> int:
        return 0

    def get_pipeline_model_parallel_rank(self) -> int:
        return 0

    def get_pipeline_model_parallel_world_size(self) -> int:
        return 1

    def get_data_parallel_rank(self) -> int:
        return 0

    def get_data_parallel_world_size(self) -> int:
        return 1

    def get_data_parallel_group(self) -> Any:
        return self.data_group

    def get_data_parallel_group_ranks(self) -> list[int]:
        return [self.rank]


# The documented switch to the decoupled engine (runtime/checkpoint_engine/README.md).
DECOUPLED: dict[str, Any] = {"decoupled": True}


def engine_config(writer: dict[str, Any] | None) -> dict[str, Any]:
    """The engine's config: ZeRO stage 0, SGD, and `{"checkpoint": {"writer": writer}}` where a writer config is given
    (None: no "checkpoint" section, the synchronous TorchCheckpointEngine). A decoupled writer without a "type" gets
    the python writer on a machine without CUDA: the default writer, "fast", pins its I/O buffer (writer_factory.py:80),
    which raises "Cannot access accelerator device when none is available" without one."""
    config: dict[str, Any] = {"train_batch_size": 1, "optimizer": {"type": "SGD", "params": {"lr": 0.1}}}
    if writer is not None:
        writer = dict(writer)
        if writer.get("decoupled") and "type" not in writer and not torch.cuda.is_available():
            writer["type"] = "python"
        config["checkpoint"] = {"writer": writer}
    return config


def build_engine(writer: dict[str, Any] | None) -> Any:
    """The one engine builder of both targets: `deepspeed.initialize` over nn.Linear(2, 2) with the mpu below and
    `engine_config(writer)`."""
    import deepspeed

    set_up()
    model = torch.nn.Linear(2, 2)
    engine, *_ = deepspeed.initialize(
        model=model, model_parameters=model.parameters(), config=engine_config(writer), mpu=_EveryRankItsOwnShard()
    )
    return engine


def _commit(engine: Any) -> None:
    """What engine.step() does at a gradient-accumulation boundary for a decoupled engine; nothing otherwise."""
    if engine.checkpoint_engine.is_decoupled():
        engine._commit_decoupled_checkpoint()


class ModelStatesFiles(CheckpointFormat):
    """`<tag>/mp_rank_<rank>_model_states.pt`, one per model-parallel rank, written in place; committed by `latest`."""

    name = (
        "DeepSpeed model-states files (one per model-parallel rank, ZeRO stage 0), committed by the `latest` tag file"
    )
    loader = "TorchCheckpointEngine.load of each rank's file"
    dcp = False
    marker = None
    data_glob = "mp_rank_*_model_states.pt"

    def data_file(self, location: str, rank: int) -> str:
        return os.path.join(location, model_file(rank))

    def committed(self, location: str, world_size: int) -> bool:
        """Every rank's file is there, and `latest` in the save_dir names this tag, or was written after every one
        of them (it then named this tag or a later one: DeepSpeed keeps one `latest` per save_dir, and an older tag
        stays loadable by name, `load_checkpoint(dir, tag=...)`)."""
        pointer = os.path.join(os.path.dirname(location), POINTER)
        files = [self.data_file(location, rank) for rank in range(world_size)]
        if not os.path.isfile(pointer) or not all(os.path.isfile(file) for file in files):
            return False
        with open(pointer) as fd:
            if fd.read().strip() == os.path.basename(location):
                return True
        published = os.stat(pointer).st_mtime_ns
        return all(os.stat(file).st_mtime_ns <= published for file in files)

    def load(self, location: str, template: dict[str, Any]) -> dict[str, Any]:
        import glob

        from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine

        files = sorted(glob.glob(os.path.join(location, self.data_glob)))
        if not files:
            raise FileNotFoundError(f"no {self.data_glob} file in {location}")
        merged: dict[str, Any] = {}
        ranks = max(int(os.path.basename(f).split("_")[2]) for f in files) + 1
        for rank in range(ranks):  # each rank's file by name, as load_checkpoint opens its own
            merged.update(TorchCheckpointEngine().load(self.data_file(location, rank), map_location="cpu"))
        missing = sorted(set(template) - set(merged))
        if missing:
            raise KeyError(
                f"keys {missing} are in no model-states file of {location}: {[os.path.basename(f) for f in files]}"
            )
        return {key: merged[key] for key in template}


FORMAT = ModelStatesFiles()


class _DeepSpeedHandle(SaveHandle):
    def __init__(self, saver: DeepSpeedSaver, number: int):
        self.saver, self.number = saver, number

    def wait(self) -> None:
        if self.saver.saves == self.number:  # an earlier save was committed when the next one started
            _commit(self.saver.engine)


class DeepSpeedSaver(Saver):
    """One DeepSpeedEngine, kept across saves; a checkpoint at `path` is `save_dir=dirname(path)`, `tag=basename`."""

    def __init__(self, writer: dict[str, Any] | None):
        self.engine = build_engine(writer)
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
    - Retention: DeepSpeed has none; `keep` is not applied (every tag is kept).
    """

    def __init__(self, root: str, keep: int, writer: dict[str, Any] | None):
        self.root, self.keep = root, keep  # keep is not applied: DeepSpeed has no retention (no manager_retention)
        self.pointer = os.path.join(root, POINTER)
        self.engine = build_engine(writer)

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
