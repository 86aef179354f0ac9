"""Neutralise the few `torch.cuda` calls of NVRx 0.4.1 and Megatron-Core 0.16.1 on CPU-only machines.

Only when `torch.cuda.is_available()` is False, and only inside the modules an adapter names (never
in `torch` itself), the name `torch` is rebound to a proxy whose `cuda` differs in exactly these calls:

- `torch.cuda.current_device()` returns "cpu": the targets use it only as the device of the one-element
  tensors of their collectives, and gloo takes CPU tensors.
- `torch.cuda.synchronize()` does nothing: it waits for device-to-host copies, and there are none.
- `torch.cuda.set_device()` does nothing and `torch.cuda.device_count()` returns 1: Megatron's
  persistent worker selects device `rank % device_count()`.

Every other attribute of `torch` and `torch.cuda` is the real one. Spawned persistent workers import
the target afresh, so adapters also route `PersistentAsyncCaller.async_loop` through a module-level
wrapper that installs the same proxy in the worker before running the original loop unchanged.
"""

from __future__ import annotations

import importlib
import types
from functools import partial

import torch

__all__ = ["install_for"]


class _CpuCuda:
    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    @staticmethod
    def current_device():
        return "cpu"

    @staticmethod
    def synchronize(device=None):
        return None

    @staticmethod
    def set_device(device):
        return None

    @staticmethod
    def device_count():
        return 1


class _TorchProxy(types.ModuleType):
    def __init__(self, real):
        super().__init__(real.__name__)
        self.__dict__["_real"] = real
        self.__dict__["cuda"] = _CpuCuda(real.cuda)

    def __getattr__(self, name):
        return getattr(self._real, name)


_original_loops: dict[str, object] = {}


def install_for(target_name: str, module_names, caller_cls) -> None:
    """Apply the proxy to `module_names` and route `caller_cls.async_loop` through it (idempotent)."""
    if torch.cuda.is_available():
        return
    proxy = _TorchProxy(torch)
    for name in module_names:
        module = importlib.import_module(name)
        if getattr(module, "torch", None) is torch:
            module.torch = proxy
    if target_name not in _original_loops:
        _original_loops[target_name] = caller_cls.__dict__["async_loop"].__func__
        caller_cls.async_loop = staticmethod(partial(_worker_loop, target_name))


def _worker_loop(target_name, *args, **kwargs):
    from spec_tests.harness.targets import load_target

    load_target(target_name)  # runs the adapter's install() in this fresh worker process
    return _original_loops[target_name](*args, **kwargs)
