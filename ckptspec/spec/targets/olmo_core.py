"""Adapter for OLMo-core's trainer checkpointer (ai2-olmo-core 3.0.0; 2.6.0, the last 2.x), `Checkpointer.save_async`
or `Checkpointer.save`, through the protocol layer; written against the documented adapter contract
(ckptspec.spec.harness.surface.contract), as an outside author would. The saver, the train module that carries the
test's state and the format are in ckptspec.spec.targets._olmo_core.

What OLMo-core offers (`olmo_core/train/checkpoint.py`, `olmo_core/train/callbacks/checkpointer.py`): a
`Checkpointer` whose `save_async(dir, train_module, train_state) -> Future[None]` writes the trainer state
synchronously and the model and optimizer state with torch's `dcp.async_save` (OLMo's `RemoteFileSystemWriter`),
and whose `dir_is_checkpoint(dir)` is the completeness rule resume uses; the trainer's `CheckpointerCallback` drives
it (`save_async`: "Save checkpoints asynchronously. Requires a separate CPU-only backend. Defaults to ``True`` if
there is one."). No abort; retention and resume live in the callback and the trainer, not judged here (no manager:
it needs a whole Trainer).

The five calls: start(state, path) is `save_async(path, module, {"global_step": 0})` (or `save`, below) with the
test's state as the train module's state dict; staged() the default (dcp.async_save stages before it returns);
wait() the future's result(), then the callback's own wait for the finalized checkpoint (`wait_for(lambda:
dir_is_checkpoint(path))` on rank 0, `_await_last_checkpoint`: `.metadata.json` is written by a done callback that
may run after result() returned), then a barrier; abort() none (the default raises NotImplementedError); close()
waits for the last save.

The configuration judged: what a user's trainer runs by default on a CPU-capable backend (gloo here, or
"cpu:gloo,cuda:nccl"), which is also the configuration the documents recommend for asynchronous saves: the
callback's `save_async=None` becomes True (`backend_supports_cpu()`) and it makes the checkpointer its own group,
`dist.new_group(timeout=timedelta(minutes=30))` (callbacks/checkpointer.py:221-232); the saver does the same. The
Checkpointer's work_dir is the folder the checkpoint is saved in, as `TrainerConfig.build` makes it the local
save_folder (train/config.py:176-181).

The same adapter runs 2.6.0, the last 2.x: its save path is 3.0.0's without the `save_state_dict_direct` branch
that 3.0.0 added for train modules that save themselves (train/checkpoint.py:121-143 in 3.0.0), which a train module
without that method never takes; callbacks/checkpointer.py and distributed/checkpoint/filesystem.py are the same
files in both, and 2.6.0's TrainerConfig.build makes the work_dir the same way (train/config.py:165-170). Line
numbers in these docstrings are 3.0.0's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptspec.spec.targets._olmo_core import FORMAT, OlmoSaver

__all__ = [
    "CAPABILITIES",
    "DISTRIBUTION",
    "EXPECTATIONS",
    "FORMAT",
    "INSTALL",
    "MODULES",
    "NAME",
    "PACKAGES",
    "protocol_saver",
]

NAME = "olmo-core"
DISTRIBUTION = "ai2-olmo-core"
INSTALL = 'pip install "torch==2.13.0" -e ".[test,olmo-core]"'
MODULES: dict[str, str] = {}
PACKAGES = ("olmo_core",)
CAPABILITIES = frozenset({"protocol"})
EXPECTATIONS = str(Path(__file__).with_name("olmo-core.expectations.toml"))


def protocol_saver(**options: Any) -> OlmoSaver:
    """A new Checkpointer saving with save_async; OLMo-core has one kind of async caller (dcp.async_save's thread),
    so every option is ignored."""
    return OlmoSaver("default")
