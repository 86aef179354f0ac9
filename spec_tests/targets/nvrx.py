"""Adapter for NVIDIA Resiliency Extension 0.4.1 (`nvidia_resiliency_ext.checkpointing`).

On a machine without a GPU, `install()` applies `_cpu_cuda` to the NVRx modules that call
`torch.cuda` (listed in `_CUDA_MODULES`), in this process and in spawned persistent workers. Nothing else
about NVRx is changed.
"""

from pathlib import Path

from spec_tests.targets import _cpu_cuda

NAME = "nvrx"
DISTRIBUTION = "nvidia-resiliency-ext"
_ROOT = "nvidia_resiliency_ext.checkpointing."
MODULES = {
    path: _ROOT + path
    for path in (
        "async_ckpt.core",
        "async_ckpt.torch_ckpt",
        "async_ckpt.filesystem_async",
        "async_ckpt.state_dict_saver",
        "async_ckpt.cached_metadata_filesystem_reader",
        "local.base_state_dict",
        "local.basic_state_dict",
        "local.ckpt_managers.base_manager",
        "local.ckpt_managers.local_manager",
        "local.replication.strategies",
    )
}
# Every NVRx module that calls torch.cuda (found with grep), public or internal.
_CUDA_MODULES = [MODULES[p] for p in ("async_ckpt.core", "async_ckpt.torch_ckpt", "async_ckpt.filesystem_async",
                                      "local.ckpt_managers.base_manager", "local.replication.strategies")] + [
    _ROOT + "local.replication." + m for m in ("_torch_future", "group_utils", "torch_device_utils")]
CAPABILITIES = frozenset({"persistent_caller", "temporal_caller", "torch_async_checkpoint",
                          "storage_writer", "msc", "local_checkpointing"})
EXPECTATIONS = str(Path(__file__).with_name("nvrx.expectations.toml"))


def install() -> None:
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import PersistentAsyncCaller

    _cpu_cuda.install_for(NAME, _CUDA_MODULES, PersistentAsyncCaller)
