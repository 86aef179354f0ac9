"""A protocol adapter for the sweeps' sides: dcp.async_save with a DefaultStager, pinned or staged (issue 60).

    --peer dcp-pinned=ckptspec.bench.dcp_side:CKPTSPEC_DCP_STAGING=pinned
    --peer dcp-staged=ckptspec.bench.dcp_side:CKPTSPEC_DCP_STAGING=staged

The benchmarks' `dcp:async_save-pinned` and `-staged` peers (ckptspec/bench/peers.py) as a target a side can load
(ckptspec/bench/side.py): `pinned` stages synchronously into page-locked host memory with non-blocking copies
(async_save returns once the copy is done), `staged` stages in the background through a DefaultStager (shared
memory, pinned and non-blocking on a GPU: the `dcp-staged` target's configuration). Both keep one DefaultStager
across saves where the installed torch can (`dcp_stager.KeptStager`; torch 2.11 cannot, and a fresh one per save
is then its honest cost), which the `dcp-staged` target's saver does not: on torch 2.11 its second save raises.
Without CUDA, pinned memory cannot be had: `pinned` then stages into ordinary memory (the CPU dry runs only).
"""

from __future__ import annotations

import os
from typing import Any

from ckptspec.bench.dcp_stager import KeptStager, staging_options
from ckptspec.spec.harness.surface.saver_api import SaveHandle, Saver
from ckptspec.spec.targets._dcp import DcpHandle

__all__ = [
    "CAPABILITIES",
    "CONFIGURATIONS",
    "DISTRIBUTION",
    "ENV",
    "EXPECTATIONS",
    "MODULES",
    "NAME",
    "PACKAGES",
    "protocol_saver",
]

NAME = "dcp-side"
DISTRIBUTION = "torch"
MODULES: dict[str, str] = {}
PACKAGES = ("torch.distributed.checkpoint",)
CAPABILITIES = frozenset({"protocol"})
EXPECTATIONS = None  # a benchmark side, never judged
ENV = "CKPTSPEC_DCP_STAGING"
CONFIGURATIONS = ("pinned", "staged")


class StagerSaver(Saver):
    """dcp.async_save (thread executor) with a DefaultStager kept across saves (see the module docstring)."""

    def __init__(self, configuration: str):
        import torch

        if configuration not in CONFIGURATIONS:
            raise ValueError(f"{ENV}={configuration!r}: one of {', '.join(CONFIGURATIONS)}")
        pinned = configuration == "pinned" and torch.cuda.is_available()
        self.configuration = configuration
        self.stager = KeptStager(staging_options(pinned=pinned, staged=configuration == "staged"))

    def start(self, state_dict: dict[str, Any], path: str) -> SaveHandle:
        import torch.distributed.checkpoint as dcp

        result = dcp.async_save(state_dict, checkpoint_id=path, async_stager=self.stager.for_save())
        return DcpHandle(result)

    def close(self) -> None:
        self.stager.close()


def protocol_saver(**options: Any) -> StagerSaver:
    """A new saver in the configuration `$CKPTSPEC_DCP_STAGING` names (default staged); other options are ignored."""
    return StagerSaver(os.environ.get(ENV, "staged"))
