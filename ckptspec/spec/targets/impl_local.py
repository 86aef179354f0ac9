"""Adapter for impl's `LocalCheckpointManager` (`ckptspec/impl/local`) judged as a checkpoint manager, beside impl's reference
manager (target `impl`): the manager area only, through the same adapter as NVRx's local manager
(ckptspec.spec.targets._local_manager), so the two are judged alike."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from ckptspec.spec.harness.surface.loading import SPEC_MODULES

if TYPE_CHECKING:
    from ckptspec.spec.targets._local_manager import LocalManager

NAME = "impl-local"
DISTRIBUTION = None
MODULES = {path: "ckptspec.impl." + path for path in SPEC_MODULES}
CAPABILITIES = frozenset({"manager", "manager_ranks"})
EXPECTATIONS = str(Path(__file__).with_name("impl-local.expectations.toml"))


def checkpoint_manager(root: str, keep: int) -> LocalManager:
    """impl's LocalCheckpointManager over `root` behind the manager contract."""
    from ckptspec.spec.targets._local_manager import LocalManager

    return LocalManager(root, keep)
