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
import threading
import time
import traceback
import types
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

# PACKAGE argument -> the prefix its spec module paths ("async_ckpt.core", ...) get.
_PREFIXES = {
    "impl": "ckptspec.impl.",
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
    except BaseException as exc:  # catches all: every failure is reported to the parent
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


# ------------------------------------------------------------------------------------- bounded calls


def outcome(bound_s: float, fn: Callable[..., Any], *args: Any) -> str:
    """What fn(*args), run in a daemon thread, did within `bound_s`: "returned", the exception's type name (with
    its message's first line after ": "), or "still waiting after N s" (the thread is left behind: a rank ends
    with os._exit)."""
    done: list[str] = []

    def call() -> None:
        try:
            fn(*args)
            done.append("returned")
        except BaseException as exc:  # catches all: every failure is reported
            first = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else ""
            done.append(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)

    thread = threading.Thread(target=call, daemon=True)
    thread.start()
    thread.join(bound_s)
    return done[0] if done else f"still waiting after {bound_s:g} s"


def _nothing() -> None:
    """The warm-up request of started_queue()."""


def started_queue() -> Any:
    """A persistent AsyncCallsQueue of the PACKAGE whose worker has started: a first request that does nothing is
    finalized (within 120 s: a spawned worker imports torch, slow on a busy host) before the caller's bounded save."""
    core = module("async_ckpt.core")
    queue = core.AsyncCallsQueue(persistent=True)
    queue.schedule_async_request(core.AsyncRequest(_nothing, (), []))
    started = outcome(120, queue.maybe_finalize_async_calls, True)
    if started != "returned":
        raise RuntimeError(f"the warm-up request: {started}")
    return queue


def linger(where: str, rank: int, world: int, bound_s: float) -> None:
    """Return once every rank has called linger(where, ...) or after `bound_s`: a rank left waiting in a collective
    must not see its peers exit (that would end its wait with a connection error instead). `where`: a directory
    shared by the ranks (scratch())."""
    Path(where, f"linger-{rank}").touch()
    deadline = time.monotonic() + bound_s
    while time.monotonic() < deadline and not all(Path(where, f"linger-{r}").exists() for r in range(world)):
        time.sleep(0.05)


# ------------------------------------------------------------------------------------- local checkpoints


def _cpu_state_dict_class() -> type:
    """CpuStateDict: a TensorAwareStateDict over a flat dict of CPU tensors and plain values.

    001 requires CUDA tensors for BasicTensorAwareStateDict and tells users with other state dicts to implement
    TensorAwareStateDict: this is such an implementation, for the PACKAGE's TensorAwareStateDict. It is reached
    as `_common.CpuStateDict` (a module attribute made on first use), so pickled parts and replicas name it."""
    base = module("local.base_state_dict").TensorAwareStateDict

    class CpuStateDict(base):  # type: ignore[misc, valid-type]
        def __init__(self, state: dict):
            self.state = dict(state)
            self.slots: dict = {}  # key -> (shape, dtype) of each popped tensor

        @property
        def is_hollow(self) -> bool:
            return bool(self.slots)

        @property
        def tensors(self) -> list:
            return [v for v in self.state.values() if isinstance(v, torch.Tensor)]

        def pop_tensors(self) -> list:
            popped = self.tensors
            self.slots = {k: (tuple(v.shape), v.dtype) for k, v in self.state.items() if isinstance(v, torch.Tensor)}
            for key in self.slots:
                del self.state[key]
            return popped

        def insert_tensors(self, tensor_data) -> None:
            self.state.update(zip(self.slots, tensor_data, strict=True))
            self.slots = {}

        def init_tensors(self) -> None:
            self.insert_tensors([torch.empty(shape, dtype=dtype) for shape, dtype in self.slots.values()])

        def copy_tensors_to_cpu(self, non_blocking: bool = False) -> None:
            for key, value in self.state.items():
                if isinstance(value, torch.Tensor):
                    self.state[key] = value.detach().to("cpu", copy=True)

        def restore_tensor_device(self, non_blocking: bool = True) -> None:
            pass

    CpuStateDict.__module__, CpuStateDict.__qualname__ = __name__, "CpuStateDict"
    return CpuStateDict


def __getattr__(name: str) -> Any:
    if name == "CpuStateDict":
        globals()[name] = _cpu_state_dict_class()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def cpu_replica_transfers() -> None:
    """Without a GPU, let NVRx send local-checkpoint replicas over gloo: its sender calls tensor.cuda() on each
    tensor, which returns a CUDA tensor itself unchanged; here the CPU tensors stand for CUDA tensors, so .cuda()
    returns the tensor itself. (The receiver's torch.empty_like(..., device="cuda") is covered by module().)"""
    if not torch.cuda.is_available():
        torch.Tensor.cuda = lambda tensor, *args, **kwargs: tensor  # type: ignore[method-assign, assignment]


# ------------------------------------------------------------------------------------------ object store


@contextmanager
def s3_stub(failing: dict[str, int]) -> Iterator[tuple[str, list[str]]]:
    """A stand-in S3 endpoint on loopback for Multi-Storage Client. Yields the MSC config file (for MSC_CONFIG) with
    profile `stub` pointing at it (bucket `ckpt`, no retries, 5 s timeouts), and the list of the paths stored.

    A PUT whose path ends with a key of `failing` is answered with that status and an S3 error; every other PUT
    succeeds (its path is listed, the data dropped); any other request is answered 404 (no such object)."""
    stored: list[str] = []
    import http.server

    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            path = self.path.split("?")[0]
            if self.command != "PUT":
                status = 404
            else:
                status = next((s for end, s in failing.items() if path.endswith(end)), 200)
            if status == 200:
                stored.append(path)
            body = (
                b""
                if status == 200
                else b"<?xml version='1.0'?><Error><Code>Stub</Code><Message>stub</Message></Error>"
            )
            self.send_response(status)
            self.send_header("ETag", '"0"')
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _answer

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    options = f"base_path: ckpt, endpoint_url: 'http://127.0.0.1:{server.server_address[1]}', region_name: us-east-1"
    options += ", connect_timeout: 5, read_timeout: 5, retries: {total_max_attempts: 1, mode: standard}"
    options += ", request_checksum_calculation: when_required"
    credentials = "{type: S3Credentials, options: {access_key: stub, secret_key: stub}}"
    with scratch() as tmp:
        config = os.path.join(tmp, "msc.yaml")
        with open(config, "w") as f:
            f.write("profiles:\n  stub:\n")
            f.write(f"    storage_provider: {{type: s3, options: {{{options}}}}}\n")
            f.write(f"    credentials_provider: {credentials}\n    retry: {{attempts: 1, delay: 0}}\n")
        try:
            yield config, stored
        finally:
            server.shutdown()
            server.server_close()
