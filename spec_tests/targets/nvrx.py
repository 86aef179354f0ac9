"""Adapter for NVIDIA Resiliency Extension 0.4.1 (`nvidia_resiliency_ext.checkpointing`).

On a machine without a GPU, `install()` applies `_cpu_cuda` to the NVRx modules that call
`torch.cuda` (core, torch_ckpt), in this process and in spawned persistent workers. Nothing else
about NVRx is changed.
"""

from pathlib import Path

from spec_tests.targets import _cpu_cuda

NAME = "nvrx"
DISTRIBUTION = "nvidia-resiliency-ext"
_ROOT = "nvidia_resiliency_ext.checkpointing."
MODULES = {
    "async_ckpt.core": _ROOT + "async_ckpt.core",
    "async_ckpt.torch_ckpt": _ROOT + "async_ckpt.torch_ckpt",
}
CAPABILITIES = frozenset({"persistent_caller", "temporal_caller", "torch_async_checkpoint"})
EXPECTATIONS = str(Path(__file__).with_name("nvrx.expectations.toml"))


def install() -> None:
    from nvidia_resiliency_ext.checkpointing.async_ckpt.core import PersistentAsyncCaller

    _cpu_cuda.install_for(NAME, MODULES.values(), PersistentAsyncCaller)
