"""torch DCP's `async_save` behind the protocol interface (ckptspec.spec.harness.surface.saver_api): the three adapters
dcp_thread, dcp_process and dcp_staged are one configuration each of the same call (seed 004).

- thread:  async_save(..., async_checkpointer_type=AsyncCheckpointerType.THREAD), a Future;
- process: async_checkpointer_type=PROCESS, one checkpoint daemon process per trainer, a Future;
- staged:  async_stager=DefaultStager(StagingOptions(...)) kept by the saver across saves, an AsyncSaveResponse
  whose staging_completion is `staged()` and upload_completion is `wait()`.

DCP has no way to abort a save in flight (abort() raises NotImplementedError) and no close for the daemon
process of PROCESS; close() waits for the saves started and closes the stager.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import torch

from ckptspec.spec.harness.surface.saver_api import SaveHandle, Saver

DISTRIBUTION = "torch"
INSTALL = 'pip install "torch==2.13.0"'
MODULES: dict[str, str] = {}  # no NVRx-shaped module: the protocol layer only
PACKAGES = ("torch.distributed.checkpoint",)
CAPABILITIES = frozenset({"protocol"})
# async_save refuses a group with no CPU backend ("A CPU backend must be enabled for async save; try initializing
# process group with 'cpu:gloo,cuda:nccl'"), so a trainer using it on GPUs makes its group this way.
NCCL_BACKEND = "cpu:gloo,cuda:nccl"


class DcpHandle(SaveHandle):
    def __init__(self, result: Any):
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

        if isinstance(result, AsyncSaveResponse):
            self.staging: Future[Any] | None = result.staging_completion
            self.upload: Future[Any] = result.upload_completion
        else:
            self.staging, self.upload = None, result

    def staged(self) -> None:
        if self.staging is not None:
            self.staging.result()

    def wait(self) -> Any:
        return self.upload.result()


class DcpSaver(Saver):
    """One configuration of dcp.async_save (see the module docstring)."""

    def __init__(self, kind: str):
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        self.kind = kind
        self.type = AsyncCheckpointerType.PROCESS if kind == "process" else AsyncCheckpointerType.THREAD
        self.stager = None
        if kind == "staged":
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            gpu = torch.cuda.is_available()  # pinned memory and non-blocking copies need an accelerator
            self.stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=gpu, use_shared_memory=True, use_async_staging=True, use_non_blocking_copy=gpu
                )
            )
        self.handles: list[DcpHandle] = []

    def start(self, state_dict: dict[str, Any], path: str) -> SaveHandle:
        import torch.distributed.checkpoint as dcp

        result = dcp.async_save(
            state_dict, checkpoint_id=path, async_checkpointer_type=self.type, async_stager=self.stager
        )
        handle = DcpHandle(result)
        self.handles.append(handle)
        return handle

    def close(self) -> None:
        for handle in self.handles:
            handle.upload.exception()  # waits; the save's own outcome is wait()'s to report
        self.handles.clear()
        if self.stager is not None:
            self.stager.close()
