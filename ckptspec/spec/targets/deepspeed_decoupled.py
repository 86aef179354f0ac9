"""Adapter for DeepSpeed's decoupled checkpoint engine (target `deepspeed-decoupled`; deepspeed 0.19.8; 0.18.3, the
release before the decoupled engine's hang fix, PR 7742, cannot build it: its DecoupledCheckpointEngine.__init__
calls `torch.multiprocessing.get_start_methods`, which does not exist, decoupled_checkpoint_engine.py:71), the
asynchronous save DeepSpeed documents: `{"checkpoint": {"writer": {"decoupled": true}}}` in the engine's config
("data_parallel" keeps its default; on a machine without CUDA "type": "python", since the default "fast" writer pins
its I/O buffer, writer_factory.py:80, and raises "Cannot access accelerator device when none is available" without
one). Written against the documented adapter contract (ckptspec.spec.harness.surface.contract), as an outside author
would; the engine, the format and both layers are in ckptspec.spec.targets._deepspeed, the default configuration is
the target `deepspeed`, whose adapter this one shares but for the writer config it hands the one engine builder
(`WRITER`) and its expectations.

DeepSpeed's engine README promises the commit: "When all the files for a tag are ready, deepspeed engine will call
`commit()` to tell the checkpoint engine current checkpoint is complete" (deepspeed/runtime/checkpoint_engine/
README.md:14). `save_checkpoint` returns once the state dict is on the writer's queue; the commit, and `latest`,
come at the next gradient-accumulation boundary of `engine.step()` (`_commit_decoupled_checkpoint`), or at
`destroy()`.

The five calls: start(state, path) is `save_checkpoint(dirname(path), tag=basename(path), client_state=state)`,
after committing a save still uncommitted (the step a trainer makes between two saves); staged() the default
(DeepSpeed has no staging signal); wait() `engine._commit_decoupled_checkpoint()`, the one private call, exactly
what `step()` calls; abort() none (the default raises NotImplementedError); close() that commit, then
`engine.destroy()` (which ends the writer). Outside the `deepspeed` launcher, CROSS_SIZE / CROSS_RANK, which
`create_universal_parallel_info` reads unconditionally (model_checkpointing/utils.py:76-77), are set to one machine
where absent (install()).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptspec.spec.targets._deepspeed import DECOUPLED, DeepSpeedManager, DeepSpeedSaver
from ckptspec.spec.targets.deepspeed import (
    CAPABILITIES,
    DISTRIBUTION,
    FORMAT,
    INSTALL,
    MODULES,
    PACKAGES,
    install,
)

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

NAME = "deepspeed-decoupled"
EXPECTATIONS = str(Path(__file__).with_name("deepspeed-decoupled.expectations.toml"))
# The engine's writer config (_deepspeed.build_engine): `{"decoupled": true}` ("type": "python" added without CUDA).
WRITER: dict[str, Any] | None = DECOUPLED


def protocol_saver(**options: Any) -> DeepSpeedSaver:
    """One engine per saver; DeepSpeed has one kind of writer per engine, so every option is ignored."""
    return DeepSpeedSaver(WRITER)


def checkpoint_manager(root: str, keep: int) -> DeepSpeedManager:
    """DeepSpeed's tags below `root`; `keep` is not applied (DeepSpeed has no retention: every tag is kept)."""
    return DeepSpeedManager(root, keep, WRITER)
