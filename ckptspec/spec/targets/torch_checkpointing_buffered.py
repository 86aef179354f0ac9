"""Adapter for torch-checkpointing's `CheckpointManager` with buffered storage (target
`torch-checkpointing-buffered`): the default configuration (ckptspec.spec.targets.torch_checkpointing, whose
docstring says how the five calls map) with `LocalFileSystemStorageConfig(use_direct_io=False)`, the one setting
under which its saves succeed on ext4, so that its commit protocol, staging and bounds are judged too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptspec.spec.targets.torch_checkpointing import (
    CAPABILITIES,
    DISTRIBUTION,
    FORMAT,
    INSTALL,
    MODULES,
    PACKAGES,
    TorchCheckpointingSaver,
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
    "protocol_saver",
]

NAME = "torch-checkpointing-buffered"
EXPECTATIONS = str(Path(__file__).with_name("torch-checkpointing-buffered.expectations.toml"))


def protocol_saver(**options: Any) -> TorchCheckpointingSaver:
    """A new saver with buffered storage (no O_DIRECT); every option is ignored."""
    return TorchCheckpointingSaver(direct_io=False)
