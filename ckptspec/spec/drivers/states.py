"""Rank r's state at version v, and the two questions a test asks of a saved checkpoint: committed? loads back?

Each rank saves its own keys (`rank_state(rank, version)`: `r<rank>` holding a tensor `w` and the plain value
`step`), so a checkpoint is complete only with every rank's data; `whole_state` is every rank's. Where a checkpoint
lies, whether it is complete and how it is read back is a format's (ckptspec.spec.harness.surface.formats; the
target's unless one is given): `committed` asks the format's rule, `assert_loads` reads the checkpoint back with the
format's loader in this process, no process group, and compares it exactly. The protocol and manager drivers and
the fault suite's saves all say it with these.
"""

from __future__ import annotations

from typing import Any

import torch

from ckptspec.spec.drivers.saving import template
from ckptspec.spec.harness.asserts import assert_state_dict_equal
from ckptspec.spec.harness.surface.formats import CheckpointFormat
from ckptspec.spec.harness.surface.loading import checkpoint_format

__all__ = ["assert_loads", "committed", "load", "rank_state", "whole_state"]


def rank_state(
    rank: int, version: int, numel: int = 12, *, shape: tuple[int, ...] | None = None, per_version: int = 1000
) -> dict[str, Any]:
    """What rank `rank` saves as checkpoint `version`: its own keys, a tensor (arange(numel) in `shape`, plus
    `per_version` * version + rank) and a plain value."""
    weight = torch.arange(numel, dtype=torch.float32)
    if shape is not None:
        weight = weight.reshape(shape)
    return {f"r{rank}": {"w": weight + per_version * version + rank, "step": version}}


def whole_state(world_size: int, version: int, numel: int = 12, **shape: Any) -> dict[str, Any]:
    """The whole checkpoint `version` of `world_size` ranks: every rank's `rank_state` (same `numel` and shape)."""
    whole: dict[str, Any] = {}
    for rank in range(world_size):
        whole.update(rank_state(rank, version, numel, **shape))
    return whole


def committed(path: str, world_size: int, fmt: CheckpointFormat | None = None) -> bool:
    """Whether the checkpoint of `world_size` ranks at `path` is complete by the format's rule."""
    return (fmt or checkpoint_format()).committed(path, world_size)


def load(want: dict[str, Any], path: str, fmt: CheckpointFormat | None = None) -> dict[str, Any]:
    """The checkpoint at `path` read back by the format (this process, no process group): want's keys."""
    return (fmt or checkpoint_format()).load(path, template(want))


def assert_loads(path: str, want: dict[str, Any], call: str = "", fmt: CheckpointFormat | None = None) -> None:
    """The checkpoint at `path` loads, by the format, to exactly `want` (P-LOAD-1 for DCP's format)."""
    fmt = fmt or checkpoint_format()
    assert_state_dict_equal(
        load(want, path, fmt),
        want,
        call=call or f"{'torch.distributed.checkpoint.load' if fmt.dcp else fmt.loader} of {path}",
    )
