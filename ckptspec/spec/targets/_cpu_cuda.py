"""Neutralise the few `torch.cuda` calls of NVRx (0.4.1, 0.7.0) and Megatron-Core (0.16.1, 0.19.2) without a GPU.

Only when `torch.cuda.is_available()` is False, and only inside the modules an adapter names (never
in `torch` itself), the name `torch` is rebound to a proxy whose `cuda` differs in exactly these calls:

- `torch.cuda.current_device()` returns "cpu": the targets use it only as the device of the one-element
  tensors of their collectives, and gloo takes CPU tensors.
- `torch.cuda.synchronize()` does nothing: it waits for device-to-host copies, and there are none.
- `torch.cuda.set_device()` does nothing and `torch.cuda.device_count()` returns 1: Megatron's
  persistent worker selects device `rank % device_count()`.
- The tensor factories `tensor`, `empty`, `empty_like`, `zeros`, `ones` and `full` given a CUDA device
  allocate on the CPU (NVRx 0.7.0: the persistent worker's start-up tensor, the collective tensor of
  `state_dict_saver`).

Every other attribute of `torch` and `torch.cuda` is the real one. Spawned persistent workers import
the target afresh, so adapters also route the worker entries of `PersistentAsyncCaller` (`async_loop`, and
`async_loop_for_daemon_worker` where the release has it) through a module-level wrapper that installs the
same proxy in the worker before running the original entry unchanged.
"""

from __future__ import annotations

import importlib
import types
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch

__all__ = ["install_for"]


class _CpuCuda:
    def __init__(self, real: Any) -> None:
        self._real = real

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def synchronize(device: Any = None) -> None:
        return None

    @staticmethod
    def set_device(device: Any) -> None:
        return None

    @staticmethod
    def device_count() -> int:
        return 1


class _TorchProxy(types.ModuleType):
    def __init__(self, real: types.ModuleType) -> None:
        super().__init__(real.__name__)
        self.__dict__["_real"] = real
        self.__dict__["cuda"] = _CpuCuda(real.cuda)

    def __getattr__(self, name: str) -> Any:
        real = getattr(self._real, name)
        return partial(_on_cpu, real) if name in _FACTORIES else real


_FACTORIES = frozenset({"tensor", "empty", "empty_like", "zeros", "ones", "full"})


def _on_cpu(factory: Callable[..., Any], *args: Any, device: Any = None, **kwargs: Any) -> Any:
    if device is not None and torch.device(device).type == "cuda":
        device = "cpu"
    return factory(*args, device=device, **kwargs)


_original_loops: dict[tuple[str, str], Callable[..., Any]] = {}
_WORKER_ENTRIES = ("async_loop", "async_loop_for_daemon_worker")


def install_for(target_name: str, module_names: Iterable[str], caller_cls: type) -> None:
    """Apply the proxy to `module_names` and route `caller_cls`'s worker entries through it (idempotent)."""
    if torch.cuda.is_available():
        return
    proxy = _TorchProxy(torch)
    for name in module_names:
        module: Any = importlib.import_module(name)  # its torch attribute is replaced
        if getattr(module, "torch", None) is torch:
            module.torch = proxy
    for entry in _WORKER_ENTRIES:
        if entry in caller_cls.__dict__ and (target_name, entry) not in _original_loops:
            _original_loops[target_name, entry] = caller_cls.__dict__[entry].__func__
            setattr(caller_cls, entry, staticmethod(partial(_worker_loop, target_name, entry)))


def _worker_loop(target_name: str, entry: str, *args: Any, **kwargs: Any) -> Any:
    from ckptspec.spec.harness.surface.loading import load_target

    load_target(target_name)  # runs the adapter's install() in this fresh worker process
    return _original_loops[target_name, entry](*args, **kwargs)
