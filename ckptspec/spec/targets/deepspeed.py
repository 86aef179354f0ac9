"""Adapter for DeepSpeed's checkpointing (deepspeed 0.19.8; 0.18.3, the release before the decoupled engine's hang
fix, PR 7742): `DeepSpeedEngine.save_checkpoint` / `load_checkpoint`, through the protocol layer (a checkpoint at the
test's path: `save_dir` its parent, `tag` its name) and the manager layer (DeepSpeed's own `global_step<N>` tags and
its `latest` tag file). Written against the documented adapter contract (ckptspec.spec.harness.surface.contract),
as an outside author would; the engine, the format and both layers are in ckptspec.spec.targets._deepspeed.

What DeepSpeed offers: `save_checkpoint(save_dir, tag, client_state)` ("client_state: State dictionary used for
saving required training states in the client code"), `load_checkpoint(load_dir, tag=None)` ("if not provided will
attempt to load tag in 'latest' file"), and a pluggable checkpoint engine, of which the decoupled one writes in a
process of its own and is committed later ("When all the files for a tag are ready, deepspeed engine will call
`commit()`", deepspeed/runtime/checkpoint_engine/README.md). No abort, no retention (every tag is kept).

The five calls: start(state, path) is `save_checkpoint(dirname(path), tag=basename(path), client_state=state)`;
staged() the default (DeepSpeed has no staging signal); wait() the commit that `engine.step()` makes at the next
gradient-accumulation boundary (`_commit_decoupled_checkpoint()`, the one private call; nothing for the
synchronous engine); abort() none (the default raises NotImplementedError); close() that commit, then
`engine.destroy()` (which ends the decoupled writer).

The configuration judged, chosen by CKPTSPEC_DEEPSPEED_CONFIG:

- "default" (unset): what `deepspeed.initialize` gives a user whose config has no "checkpoint" section, the
  synchronous `TorchCheckpointEngine`: save_checkpoint writes the files and `latest` before it returns. A
  synchronous save is a correct, if slow, asynchronous one; this is the configuration most DeepSpeed jobs run.
- "decoupled": the asynchronous engine DeepSpeed documents (`{"checkpoint": {"writer": {"decoupled": true}}}`),
  with the two settings a plain data-parallel job on a CPU machine needs to start it at all, each a finding of its
  own: "type": "python" (the default "fast" writer needs the async_io op, libaio, absent here) and
  "data_parallel": "replica" (without it `deepspeed.initialize` raises AttributeError without a Megatron mpu,
  data_parallel_writer_factory.py:95); CROSS_SIZE / CROSS_RANK, which only the `deepspeed` launcher sets and
  `create_universal_parallel_info` reads unconditionally (model_checkpointing/utils.py:76-77), are set to one
  machine where absent (install()).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptspec.spec.targets._deepspeed import FORMAT, DeepSpeedManager, DeepSpeedSaver, configuration, set_up

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
# No manager_retention (DeepSpeed keeps every tag), no manager_ranks (at ZeRO stage 0 only data-parallel rank 0's
# client_state is written: DeepSpeed treats client_state as replicated).
CAPABILITIES = frozenset({"protocol", "manager", "manager_pointer"})
EXPECTATIONS = str(Path(__file__).with_name("deepspeed.expectations.toml"))


def install() -> None:
    """DS_ACCELERATOR=cpu without CUDA; CROSS_SIZE/CROSS_RANK as the deepspeed launcher sets them."""
    set_up()


def protocol_saver(**options: Any) -> DeepSpeedSaver:
    """One engine per saver, in the configuration CKPTSPEC_DEEPSPEED_CONFIG names; DeepSpeed has one kind of writer
    per engine, so every option is ignored."""
    return DeepSpeedSaver(configuration())


def checkpoint_manager(root: str, keep: int) -> DeepSpeedManager:
    """DeepSpeed's tags below `root`; keep > 0 raises ValueError (DeepSpeed has no retention)."""
    return DeepSpeedManager(root, keep, configuration())
