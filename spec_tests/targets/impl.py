"""Adapter for `impl`, this project's reference implementation."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from spec_tests.harness.targets import SPEC_MODULES

if TYPE_CHECKING:
    from spec_tests.targets._queue_saver import QueueSaver

NAME = "impl"
DISTRIBUTION = None
MODULES = {path: "impl." + path for path in SPEC_MODULES}
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
    }
)
EXPECTATIONS = str(Path(__file__).with_name("impl.expectations.toml"))
# impl mirrors nvidia_resiliency_ext.checkpointing module by module; its page lists the NVRx names it leaves out
# (spec_tests/test_api_surface.py, API-2).
NVRX_MIRROR = "impl"
NVRX_LEFT_OUT = str(Path(__file__).resolve().parents[2] / "docs" / "impl.md")


STAGING_ENV = "CKPTSPEC_IMPL_STAGING"
"""`overlapped`: the protocol saver schedules on `AsyncCallsQueue(overlap_staging=True)` (where the test leaves the
caller persistent) and `staged()` is `wait_for_staging()`; unset or `sync`: impl's default queue (docs/impl.md)."""


def protocol_saver(**options: Any) -> QueueSaver:
    """The protocol interface over the NVRx guide's recipe (spec_tests.targets._queue_saver)."""
    from spec_tests.targets._queue_saver import saver_of

    mode = os.environ.get(STAGING_ENV, "sync")
    if mode not in ("sync", "overlapped"):
        raise ValueError(f"{STAGING_ENV}={mode!r}: expected 'sync' or 'overlapped'")
    persistent = options.get("persistent")
    overlapped = mode == "overlapped" and persistent is not False
    queue_options = {"overlap_staging": True} if overlapped else None
    return saver_of(NAME, persistent, queue_options=queue_options, staging_signal="wait_for_staging")
