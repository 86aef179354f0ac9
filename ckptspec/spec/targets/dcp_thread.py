"""Adapter for torch DCP's `async_save` with the thread configuration (target `dcp-thread`; see ckptspec.spec.targets._dcp)."""

from pathlib import Path
from typing import Any

from ckptspec.spec.targets._dcp import CAPABILITIES, DISTRIBUTION, INSTALL, MODULES, NCCL_BACKEND, PACKAGES, DcpSaver

__all__ = [
    "CAPABILITIES",
    "DISTRIBUTION",
    "EXPECTATIONS",
    "INSTALL",
    "MODULES",
    "NAME",
    "NCCL_BACKEND",
    "PACKAGES",
    "protocol_saver",
]

NAME = "dcp-thread"
EXPECTATIONS = str(Path(__file__).with_name("dcp-thread.expectations.toml"))


def protocol_saver(**options: Any) -> DcpSaver:
    """dcp.async_save with the thread configuration; options of other targets' savers are ignored."""
    return DcpSaver("thread")
