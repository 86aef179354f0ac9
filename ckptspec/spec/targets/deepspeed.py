"""Adapter for DeepSpeed's checkpointing as a DeepSpeed job runs it by default (target `deepspeed`; deepspeed 0.19.8):
`DeepSpeedEngine.save_checkpoint` / `load_checkpoint` with the synchronous `TorchCheckpointEngine`, what
`deepspeed.initialize` gives a config without a "checkpoint" section. The asynchronous configuration DeepSpeed
documents, the decoupled engine, is the target `deepspeed-decoupled` (ckptspec.spec.targets.deepspeed_decoupled).
Written against the documented adapter contract (ckptspec.spec.harness.surface.contract), as an outside author
would; the engine, the format and both layers are in ckptspec.spec.targets._deepspeed.

What DeepSpeed offers: `save_checkpoint(save_dir, tag, client_state)` ("client_state: State dictionary used for
saving required training states in the client code"), `load_checkpoint(load_dir, tag=None)` ("if not provided will
attempt to load tag in 'latest' file"). No abort, no retention (every tag is kept).

The five calls, through the protocol layer (a checkpoint at the test's path: `save_dir` its parent, `tag` its name):
start(state, path) is `save_checkpoint(dirname(path), tag=basename(path), client_state=state)`; staged() the
default (DeepSpeed has no staging signal); wait() the decoupled commit (nothing here: the save is written before
start() returns); abort() none (the default raises NotImplementedError); close() `engine.destroy()`. The manager
layer: DeepSpeed's own `global_step<N>` tags and its `latest` tag file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptspec.spec.targets._deepspeed import FORMAT, DeepSpeedManager, DeepSpeedSaver, set_up

__all__ = [
    "CAPABILITIES",
    "DISTRIBUTION",
    "EXPECTATIONS",
    "FORMAT",
    "INSTALL",
    "MODULES",
    "NAME",
    "PACKAGES",
    "checkpoint_manager",
    "install",
    "protocol_saver",
]

NAME = "deepspeed"
DISTRIBUTION = "deepspeed"
INSTALL = 'pip install "torch==2.13.0" -e ".[test,deepspeed]"'
MODULES: dict[str, str] = {}
PACKAGES = ("deepspeed",)
# No manager_retention: DeepSpeed keeps every tag. manager_ranks: each rank writes its own model-states file.
CAPABILITIES = frozenset({"protocol", "manager", "manager_pointer", "manager_ranks"})
EXPECTATIONS = str(Path(__file__).with_name("deepspeed.expectations.toml"))
# The engine's writer config (_deepspeed.build_engine): None, no "checkpoint" section, the synchronous engine.
WRITER: dict[str, Any] | None = None


def install() -> None:
    """DS_ACCELERATOR=cpu without CUDA; CROSS_SIZE/CROSS_RANK as the deepspeed launcher sets them."""
    set_up()


def protocol_saver(**options: Any) -> DeepSpeedSaver:
    """One engine per saver; DeepSpeed has one kind of writer per engine, so every option is ignored."""
    return DeepSpeedSaver(WRITER)


def checkpoint_manager(root: str, keep: int) -> DeepSpeedManager:
    """DeepSpeed's tags below `root`; `keep` is not applied (DeepSpeed has no retention: every tag is kept)."""
    return DeepSpeedManager(root, keep, WRITER)
