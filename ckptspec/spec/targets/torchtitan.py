"""Adapter for torchtitan's CheckpointManager (0.3.0; 0.2.2, where it lives at another module path) with async_mode
"async" (target `torchtitan`; see ckptspec.spec.targets._torchtitan): `dcp.async_save` on the manager's own gloo
group, one save in flight; through the protocol layer (a checkpoint at the test's path) and the manager layer (its
own step-<N> folders and retention).

Unjudged: async_mode "async_with_pinned_mem", the mode a GPU user runs (pinned, non-blocking staging through torch's
DefaultStager). It refuses to run without an accelerator, so none of this target's verdicts, all measured on CPU,
speak for it (docs/adding-a-target.md, step 7)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptspec.spec.targets._torchtitan import (
    CAPABILITIES,
    DISTRIBUTION,
    INSTALL,
    MODULES,
    PACKAGES,
    TitanManager,
    TitanSaver,
)

__all__ = [
    "CAPABILITIES",
    "DISTRIBUTION",
    "EXPECTATIONS",
    "INSTALL",
    "MODULES",
    "NAME",
    "PACKAGES",
    "checkpoint_manager",
    "protocol_saver",
]

NAME = "torchtitan"
EXPECTATIONS = str(Path(__file__).with_name("torchtitan.expectations.toml"))


def protocol_saver(**options: Any) -> TitanSaver:
    """A CheckpointManager(async_mode="async"); torchtitan has one kind of caller, so every option is ignored."""
    return TitanSaver("async")


def checkpoint_manager(root: str, keep: int) -> TitanManager:
    """torchtitan's CheckpointManager over `root` with keep_latest_k=keep (ckptspec.spec.targets._torchtitan)."""
    return TitanManager(root, keep)
