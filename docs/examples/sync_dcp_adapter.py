"""An example adapter (docs/adding-a-target.md): torch's synchronous `dcp.save` behind the protocol layer.

Run the protocol suite against it from the repository root:

    PYTHONPATH=docs/examples pytest ckptspec/spec/protocol/test_snapshot.py -n 2 --impl sync_dcp_adapter

A synchronous save is a correct, if slow, asynchronous one: start() returns once the checkpoint is written, so the
snapshot, staging and durability promises hold trivially. It has no way to abort, which its expectations file lists.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptspec.spec.harness.surface.saver_api import SaveHandle, Saver

NAME = "sync-dcp"
DISTRIBUTION = "torch"  # the report's column shows the installed torch version
MODULES: dict[str, str] = {}  # no NVRx-shaped module: only the protocol tests run, the others skip
PACKAGES = ("torch.distributed.checkpoint",)  # what the adapter imports: checked at load, and its version reported
CAPABILITIES = frozenset({"protocol"})
EXPECTATIONS = str(Path(__file__).with_name("sync_dcp_adapter.expectations.toml"))


class _Done(SaveHandle):
    def wait(self) -> None:
        return None  # start() returned after the save was complete on every rank


class SyncDcpSaver(Saver):
    def start(self, state_dict: dict, path: str) -> SaveHandle:
        import torch.distributed.checkpoint as dcp

        dcp.save(state_dict, checkpoint_id=path)
        return _Done()

    def close(self) -> None:
        return None


def protocol_saver(**options: Any) -> SyncDcpSaver:
    """A new saver; options meant for other targets' savers (such as `persistent`) are ignored."""
    return SyncDcpSaver()
