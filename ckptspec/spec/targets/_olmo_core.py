"""OLMo-core's `Checkpointer` behind the protocol layer (the adapter `olmo-core`, ckptspec.spec.targets.olmo_core,
says what is judged). Written against the documented adapter contract (ckptspec.spec.harness.surface.contract), as
an outside author would.

The test's state dict is the train module's state (`state_dict_to_save()`), saved by DCP below
`<path>/model_and_optim/`: each rank its own keys. `save_async` first prepares `<path>-tmp`, writes the trainer state
(`train/rank<r>.pt`, torch.save) there and renames it onto `<path>` (all before it returns), then starts
`async_save_state_dict`, torch's `dcp.async_save` with OLMo's `RemoteFileSystemWriter` on the checkpointer's group,
and adds a done callback that writes `<path>/.metadata.json` on rank 0 whatever the future's outcome
(checkpoint.py:190-195 in 3.0.0, 174-179 in 2.6.0).

The format (FORMAT) is DCP's below `model_and_optim/` with OLMo's completeness rule (`Checkpointer.dir_is_checkpoint`:
`train/rank0.pt`, `model_and_optim/.metadata` and `.metadata.json` all present), read back with dcp.load and OLMo's
`RemoteFileSystemReader`, as `Checkpointer.load` reads it (the stock FileSystemReader cannot: OLMo's writer records
its own `_StorageInfo`).
"""

from __future__ import annotations

import os
from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any

from ckptspec.spec.harness.surface.formats import CheckpointFormat
from ckptspec.spec.harness.surface.saver_api import SaveHandle, Saver

__all__ = ["FORMAT", "OlmoCheckpointDir", "OlmoSaver"]


class OlmoCheckpointDir(CheckpointFormat):
    """DCP below `model_and_optim/`, per-rank trainer state in `train/`, committed by `.metadata.json`."""

    name = "OLMo-core trainer checkpoint (DCP in model_and_optim/, train/rank<r>.pt, .metadata.json)"
    loader = "dcp.load with RemoteFileSystemReader (Checkpointer.load's reader)"
    dcp = False  # stock dcp.load reads model_and_optim/, not the checkpoint directory itself
    marker = ".metadata.json"
    data_glob = "*.distcp"  # in model_and_optim/ (matched on the file name)

    def data_file(self, location: str, rank: int) -> str:
        return os.path.join(location, "model_and_optim", f"__{rank}_0.distcp")

    def committed(self, location: str, world_size: int) -> bool:
        from olmo_core.train.checkpoint import Checkpointer

        return bool(Checkpointer.dir_is_checkpoint(location))

    def load(self, location: str, template: dict[str, Any]) -> dict[str, Any]:
        import torch.distributed.checkpoint as dcp
        from olmo_core.distributed.checkpoint.filesystem import RemoteFileSystemReader

        # OLMo's writer records its own _StorageInfo, which stock FileSystemReader cannot read (AttributeError:
        # '_StorageInfo' object has no attribute 'transform_descriptors'): its own reader, as load_state_dict uses.
        reader = RemoteFileSystemReader(os.path.join(location, "model_and_optim"))
        dcp.load(template, storage_reader=reader, no_dist=True)
        return template


FORMAT = OlmoCheckpointDir()


def state_module(state: dict[str, Any]) -> Any:
    """A TrainModule whose state is the test's state dict (what a trainer's model and optimizer would be)."""
    from olmo_core.train.train_module import TrainModule

    class StateModule(TrainModule):
        def __init__(self, state: dict[str, Any]) -> None:
            super().__init__()
            self.state = state

        def state_dict(self, *, optim: bool | None = None) -> dict[str, Any]:
            return self.state

        def load_state_dict(self, state_dict: dict[str, Any]) -> None:
            self.state = state_dict

        def train_batch(self, batch: dict[str, Any], dry_run: bool = False) -> None:
            raise NotImplementedError

        def eval_batch(self, batch: dict[str, Any], labels: Any = None) -> Any:
            raise NotImplementedError

        def optim_step(self) -> None:
            raise NotImplementedError

        def zero_grads(self) -> None:
            raise NotImplementedError

        def num_flops_per_token(self, seq_len: int) -> int | None:
            return None

        def global_num_flops_in_batch(self, batch: dict[str, Any]) -> int | None:
            return None

        @property
        def eval_batch_spec(self) -> Any:
            raise NotImplementedError

    return StateModule(state)


class _OlmoHandle(SaveHandle):
    def __init__(self, saver: OlmoSaver, path: str, future: Future[None] | None):
        self.saver, self.path, self.future = saver, path, future

    def _finalized(self) -> bool:
        return bool(self.saver.checkpointer.dir_is_checkpoint(self.path))

    def await_save(self) -> None:
        """CheckpointerCallback._await_last_checkpoint (callbacks/checkpointer.py:153-166): the future's result, then
        on rank 0 the wait for the finalized checkpoint (`.metadata.json` is written by a done callback)."""
        from olmo_core.distributed.utils import get_rank
        from olmo_core.utils import wait_for

        if self.future is not None:
            future, self.future = self.future, None
            future.result()
            if get_rank() == 0:
                wait_for(self._finalized, "waiting to finalize checkpoint")

    def wait(self) -> None:
        import torch.distributed as dist

        self.await_save()
        if dist.is_initialized():
            dist.barrier()  # every rank sees the checkpoint rank 0 finalized


class OlmoSaver(Saver):
    """One Checkpointer, kept across saves as the trainer keeps it: its own (gloo) group for save_async, as the
    callback makes it, or the default group for the synchronous save."""

    def __init__(self, kind: str) -> None:
        import torch.distributed as dist

        self.kind = kind
        self.group = (
            dist.new_group(timeout=timedelta(minutes=30)) if kind == "default" and dist.is_initialized() else None
        )
        self.checkpointer: Any = None  # made at the first save, in the folder it saves into
        self.last: _OlmoHandle | None = None

    def start(self, state_dict: dict[str, Any], path: str) -> SaveHandle:
        from olmo_core.train.checkpoint import Checkpointer

        # The trainer's work_dir is its save_folder when that is local (TrainerConfig.build, train/config.py:176-181):
        # here the folder the checkpoint is saved in. Checkpointer only makes it (exist_ok) and reads it for remote
        # folders.
        work_dir = Path(os.path.dirname(os.path.abspath(path)))
        if self.checkpointer is None:
            self.checkpointer = Checkpointer(work_dir=work_dir, process_group=self.group)
        self.checkpointer.work_dir = work_dir
        if self.last is not None:
            # The callback awaits the last save before it starts the next one (_save_checkpoint,
            # callbacks/checkpointer.py:168-170): a trainer never has two saves of one Checkpointer in flight.
            self.last.await_save()
        module, train_state = state_module(state_dict), {"global_step": 0}
        if self.kind == "sync":
            self.checkpointer.save(path, module, train_state)
            return _OlmoHandle(self, path, None)
        self.last = _OlmoHandle(self, path, self.checkpointer.save_async(path, module, train_state))
        return self.last

    def close(self) -> None:
        if self.last is not None:
            self.last.await_save()  # CheckpointerCallback.post_train awaits the last save
