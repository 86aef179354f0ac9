"""What every reproducer shares: the package it exercises, a CPU stand-in for a few CUDA calls, gloo ranks.

A reproducer runs as

    python findings/repro/<target>-<release>/<clause>.py PACKAGE

with PACKAGE one of `nvidia_resiliency_ext` (NVRx, `nvidia_resiliency_ext.checkpointing`), `megatron.core`
(Megatron-Core, `megatron.core.dist_checkpointing.strategies`) or `impl` (ckptspec's reference implementation,
which has NVRx's module paths). It needs torch and that package only, runs on CPU with gloo, prints what it saw,
and exits 1 where the clause is broken, 0 where it holds, 2 when it could not run (bad argument, a rank that
failed in the reproducer's own set-up).

Without a GPU the libraries' few `torch.cuda` calls (the device of a one-element collective tensor,
`synchronize`, `set_device`, `device_count`) would fail before the behaviour shown is reached. `module()`
therefore rebinds the name `torch`, in the library's own modules only, to a proxy whose `cuda` answers those
calls for the CPU and whose tensor factories put CUDA-device tensors on the CPU. Everything else is the real
torch; nothing about the library's logic changes. Spawned worker processes re-import the reproducer script
(multiprocessing's spawn start method does), which calls `module()` again, so they get the same proxy.
"""

from __future__ import annotations

import faulthandler
import functools
import importlib
import multiprocessing as mp
import os
import queue
import shutil
import signal
import socket
import sys
import tempfile
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import Any

import torch
import torch.distributed as dist

# PACKAGE argument -> the prefix its spec module paths ("async_ckpt.core", ...) get.
_PREFIXES = {
    "impl": "impl.",
    "nvidia_resiliency_ext": "nvidia_resiliency_ext.checkpointing.",
}
# Megatron-Core has the async core and the storage modules under other names.
_MCORE = {
    "async_ckpt.core": "megatron.core.dist_checkpointing.strategies.async_utils",
    "async_ckpt.filesystem_async": "megatron.core.dist_checkpointing.strategies.filesystem_async",
    "async_ckpt.state_dict_saver": "megatron.core.dist_checkpointing.strategies.state_dict_saver",
}
PACKAGES = (*_PREFIXES, "megatron.core")


def package() -> str:
    """The PACKAGE argument (exits 2 with the usage on a missing or unknown one)."""
    if len(sys.argv) != 2 or sys.argv[1] not in PACKAGES:
        _usage_error(f"usage: python {sys.argv[0]} {{{'|'.join(PACKAGES)}}}")
    return sys.argv[1]


def _usage_error(message: str) -> None:
    print(message, file=sys.stderr)
    sys.exit(2)


def module(path: str) -> types.ModuleType:
    """The PACKAGE's module for spec path `path` (e.g. "async_ckpt.core"), with the CPU stand-in applied."""
    name = package()
    if name == "megatron.core":
        if path not in _MCORE:
            _usage_error(f"Megatron-Core has no counterpart of {path}")
        full = _MCORE[path]
    else:
        full = _PREFIXES[name] + path
    found = importlib.import_module(full)
    if not torch.cuda.is_available():
        root = full.split(".")[0]
        for mod in list(sys.modules.values()):
            if getattr(mod, "__name__", "").startswith(root) and getattr(mod, "torch", None) is torch:
                mod.torch = _CPU_TORCH  # type: ignore[attr-defined]
    return found


class _CpuCuda:
    """torch.cuda, except for the four calls the libraries make for collectives and workers."""

    def __getattr__(self, name: str) -> Any:
        return getattr(torch.cuda, name)

    current_device = staticmethod(lambda: "cpu")
    synchronize = staticmethod(lambda device=None: None)
    set_device = staticmethod(lambda device: None)
    device_count = staticmethod(lambda: 1)


def _cpu_factory(factory: Callable[..., torch.Tensor], *args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
    if device is not None and torch.device(device).type == "cuda":
        device = "cpu"
    return factory(*args, device=device, **kwargs)


class _CpuTorch(types.ModuleType):
    cuda = _CpuCuda()

    def __getattr__(self, name: str) -> Any:
        real = getattr(torch, name)
        if name in ("tensor", "empty", "empty_like", "zeros", "ones", "full"):
            return functools.partial(_cpu_factory, real)
        return real


_CPU_TORCH = _CpuTorch("torch")


# ----------------------------------------------------------------------------------------------------- ranks


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _rank_main(
    body: Callable[..., Any], rank: int, world: int, port: int, out: Any, hang_s: float, args: tuple
) -> None:
    os.setpgrp()  # the parent ends this rank and whatever it started with one killpg
    faulthandler.dump_traceback_later(hang_s, exit=False)  # where a hung rank is, on its stderr
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
        result = ("returned", body(rank, world, *args))
    except BaseException as exc:  # noqa: BLE001 - every failure is reported to the parent
        result = ("raised", f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=-3)}")
    out.put((rank, *result))
    out.close()
    out.join_thread()
    os._exit(0)  # skip the library's exit hooks: what is judged is what the body returned or raised


def run_ranks(body: Callable[..., Any], *args: Any, world: int = 2, timeout_s: float = 60.0) -> dict[int, tuple]:
    """Run `body(rank, world, *args)` on `world` forked gloo ranks. Returns {rank: ("returned", value) |
    ("raised", text) | ("hung", None)}; a rank still running after `timeout_s` is "hung" (its stack is dumped to
    stderr a few seconds before) and is killed with everything it started. Whatever a rank that returned started
    and left running (its process group) is killed too."""
    ctx = mp.get_context("fork")
    out = ctx.Queue()
    port = _free_port()
    procs = [
        ctx.Process(target=_rank_main, args=(body, r, world, port, out, max(timeout_s - 3, 1), args))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    results: dict[int, tuple] = {}
    try:
        while len(results) < world:
            rank, how, value = out.get(timeout=timeout_s)
            results[rank] = (how, value)
    except queue.Empty:
        pass
    finally:
        for p in procs:
            p.join(timeout=5)
            # Also when the rank returned: what it started and left behind (a library's spawned worker,
            # multiprocessing manager or resource tracker) is still in its process group, orphaned.
            with suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.join(timeout=5)
    return {r: results.get(r, ("hung", None)) for r in range(world)}


@contextmanager
def scratch() -> Iterator[str]:
    """A temporary directory, removed (that path only) afterwards."""
    path = tempfile.mkdtemp(prefix="ckptspec-repro-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def verdict(broken: bool, what: str) -> None:
    """Print the finding and exit: 1 if `broken`, else 0."""
    print(("BROKEN: " if broken else "HOLDS: ") + what)
    sys.exit(1 if broken else 0)


def setup_failed(results: dict[int, tuple]) -> None:
    """Exit 2 printing each rank's result: the reproducer could not show what it looks for."""
    print("could not run the reproducer:")
    for rank, (how, value) in sorted(results.items()):
        print(f"  rank {rank}: {how}: {value}")
    sys.exit(2)
