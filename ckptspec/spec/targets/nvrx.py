"""Adapter for NVIDIA Resiliency Extension 0.4.1 and 0.7.0 (`nvidia_resiliency_ext.checkpointing`).

On a machine without a GPU, `install()` applies `_cpu_cuda` to the NVRx modules that call
`torch.cuda` (listed in `_CUDA_MODULES`), in this process and in spawned persistent workers. Nothing else
about NVRx is changed, except two device calls that move local-checkpoint replicas between ranks
(`local/replication/group_utils.py`), neutralised the same way (`_cpu_replica_transfers`):

- `GroupWrapper.isend_state_dict` calls `tensor.cuda()` on each tensor before `dist.send`: while that
  method runs, `torch.Tensor.cuda` returns the tensor itself (restored when it returns).
- `GroupWrapper.irecv_state_dict` receives into `torch.empty_like(t, device='cuda')`: in that module
  `torch.empty_like` allocates on the CPU when asked for a CUDA device.

gloo sends and receives CPU tensors; the values, their order and the protocol are unchanged.
"""

from __future__ import annotations

import importlib
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ckptspec.spec.harness.surface.loading import SPEC_MODULES
from ckptspec.spec.targets import _cpu_cuda

if TYPE_CHECKING:
    from ckptspec.spec.targets._local_manager import LocalManager
    from ckptspec.spec.targets._queue_saver import QueueSaver

NAME = "nvrx"
DISTRIBUTION = "nvidia-resiliency-ext"
INSTALL = 'pip install "torch==2.13.0" -e ".[test,nvrx]"'
_ROOT = "nvidia_resiliency_ext.checkpointing."
MODULES = {path: _ROOT + path for path in SPEC_MODULES}
# Every NVRx module that calls torch.cuda (found with grep), public or internal.
_CUDA_MODULES = [
    MODULES[p]
    for p in (
        "async_ckpt.core",
        "async_ckpt.torch_ckpt",
        "async_ckpt.filesystem_async",
        "async_ckpt.state_dict_saver",  # 0.7.0: torch.tensor(..., device="cuda") for a collective
        "local.ckpt_managers.base_manager",
        "local.replication.strategies",
    )
] + [_ROOT + "local.replication." + m for m in ("_torch_future", "group_utils", "torch_device_utils")]
CAPABILITIES = frozenset(
    {
        "persistent_caller",
        "temporal_caller",
        "torch_async_checkpoint",
        "storage_writer",
        "msc",
        "local_checkpointing",
        "protocol",
        "manager",
        "manager_ranks",
    }
)
EXPECTATIONS = str(Path(__file__).with_name("nvrx.expectations.toml"))


def install() -> None:
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import PersistentAsyncCaller

    _cpu_cuda.install_for(NAME, _CUDA_MODULES, PersistentAsyncCaller)
    _cpu_replica_transfers()


class _CpuAllocations(types.ModuleType):
    """`torch` for group_utils: empty_like(..., device=<cuda>) allocates on the CPU; all else is unchanged."""

    def __init__(self, real: types.ModuleType) -> None:
        super().__init__(real.__name__)
        self.__dict__["_real"] = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def empty_like(self, tensor: Any, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        if device is not None and torch.device(device).type == "cuda":
            device = "cpu"
        return self._real.empty_like(tensor, *args, device=device, **kwargs)


def _tensor_itself(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor


def _cpu_replica_transfers() -> None:
    """Without a GPU, let NVRx send local-checkpoint replicas over gloo (see the module docstring)."""
    if torch.cuda.is_available():
        return
    group_utils: Any = importlib.import_module(_ROOT + "local.replication.group_utils")
    wrapper = group_utils.GroupWrapper
    if getattr(wrapper.isend_state_dict, "_ckptspec_original", None) is not None:
        return
    group_utils.torch = _CpuAllocations(group_utils.torch)
    original = wrapper.isend_state_dict

    def isend_state_dict(self: Any, state_dict: Any, dst: int) -> Any:
        # Patched on purpose, for the duration of the call (mypy forbids assigning to a method).
        torch.Tensor.cuda = _tensor_itself  # type: ignore[method-assign, assignment]
        try:
            return original(self, state_dict, dst)
        finally:
            del torch.Tensor.cuda  # uncovers torch's own Tensor.cuda again

    isend_state_dict._ckptspec_original = original  # type: ignore[attr-defined]  # marks the patch (read above)
    wrapper.isend_state_dict = isend_state_dict


def protocol_saver(**options: Any) -> QueueSaver:
    """The protocol interface over the NVRx guide's recipe (ckptspec.spec.targets._queue_saver)."""
    from ckptspec.spec.targets._queue_saver import saver_of

    return saver_of(NAME, options.get("persistent"))


def checkpoint_manager(root: str, keep: int) -> LocalManager:
    """NVRx's LocalCheckpointManager over `root` behind the manager contract (ckptspec.spec.targets._local_manager)."""
    from ckptspec.spec.targets._local_manager import LocalManager

    return LocalManager(root, keep)
