"""Adapter for `impl`, this project's reference implementation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptspec.spec.harness.surface.loading import SPEC_MODULES
from ckptspec.spec.harness.surface.manager_api import CheckpointManager

if TYPE_CHECKING:
    from ckptspec.spec.targets._queue_saver import QueueSaver

NAME = "impl"
DISTRIBUTION = None
MODULES = {path: "ckptspec.impl." + path for path in SPEC_MODULES}
CAPABILITIES = frozenset(
    {
        "persistent_caller",
        "temporal_caller",
        "torch_async_checkpoint",
        "no_process_group",
        "storage_writer",
        "msc",
        "local_checkpointing",
        "protocol",
        "manager",
        "manager_retention",
        "manager_pointer",
        "manager_ranks",
    }
)
EXPECTATIONS = str(Path(__file__).with_name("impl.expectations.toml"))
# impl mirrors nvidia_resiliency_ext.checkpointing module by module; its page lists the NVRx names it leaves out
# (ckptspec/spec/test_api_surface.py, API-2).
NVRX_MIRROR = "ckptspec.impl"
NVRX_LEFT_OUT = str(Path(__file__).resolve().parents[3] / "docs" / "impl.md")


STAGING_ENV = "CKPTSPEC_IMPL_STAGING"
"""`overlapped`: the protocol saver schedules on `AsyncCallsQueue(overlap_staging=True)` (where the test leaves the
caller persistent) and `staged()` is `wait_for_staging()`; unset or `sync`: impl's default queue (docs/impl.md)."""


PLAN_CACHE_ENV = "CKPTSPEC_IMPL_PLAN_CACHE"
"""`1`: the protocol saver plans with `enable_cache=True` (so a repeated save is prepared, docs/impl.md); unset or
`0`: it plans every save in full, as the NVRx guide's recipe does."""


def protocol_saver(**options: Any) -> QueueSaver:
    """The protocol interface over the NVRx guide's recipe (ckptspec.spec.targets._queue_saver)."""
    from ckptspec.spec.targets._queue_saver import saver_of

    mode = os.environ.get(STAGING_ENV, "sync")
    if mode not in ("sync", "overlapped"):
        raise ValueError(f"{STAGING_ENV}={mode!r}: expected 'sync' or 'overlapped'")
    persistent = options.get("persistent")
    overlapped = mode == "overlapped" and persistent is not False
    queue_options = {"overlap_staging": True} if overlapped else None
    plan_cache = os.environ.get(PLAN_CACHE_ENV, "0")
    if plan_cache not in ("0", "1"):
        raise ValueError(f"{PLAN_CACHE_ENV}={plan_cache!r}: expected '0' or '1'")
    return saver_of(
        NAME, persistent, queue_options=queue_options, staging_signal="wait_for_staging", plan_cache=plan_cache == "1"
    )


class ImplManager(CheckpointManager):
    """impl's reference manager (ckptspec/impl/manager.py) behind the manager contract: every call is its own."""

    def __init__(self, root: str, keep: int):
        from ckptspec.impl.manager import ReferenceManager

        self.manager = ReferenceManager(root, keep)
        self.pointer = self.manager.pointer

    def save(self, step: int, state_dict: dict[str, Any]) -> None:
        self.manager.save(step, state_dict)

    def wait(self) -> None:
        self.manager.wait()

    def latest(self) -> int | None:
        return self.manager.latest()

    def resume(self, template: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        return self.manager.resume(template)

    def load(self, step: int, template: dict[str, Any]) -> dict[str, Any]:
        return self.manager.load(step, template)

    def location(self, step: int) -> str:
        return self.manager.location(step)

    def steps(self) -> list[int]:
        return self.manager.steps()

    def close(self) -> None:
        self.manager.close()


def checkpoint_manager(root: str, keep: int) -> ImplManager:
    """impl's reference manager over `root`, retaining `keep` checkpoints (0: all)."""
    return ImplManager(root, keep)
