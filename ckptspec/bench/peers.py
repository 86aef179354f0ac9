"""The checkpointing methods the benchmarks compare ("peers"), each behind the same calls (ckptspec.bench.peer_api).

A peer's name is `family:method`. The family is the checkpoint format: `dcp` peers write a
torch.distributed.checkpoint directory (loadable with `dcp.load`), `torch` peers write one
`torch.save` file. `durable` says whether the data is fsync'ed before the save counts as done
(`torch.save` never fsyncs).

- `dcp:impl`, `dcp:nvrx` (+ `-temporal`): FileSystemWriterAsync + save_state_dict_async_plan +
  AsyncCallsQueue of the target, as in the NVRx usage guide; finalize writes `.metadata`.
- `dcp:impl-overlapped`: the same on `AsyncCallsQueue(overlap_staging=True)`: the save returns once the copies are
  issued, and the trainer calls `wait_for_staging()` in `before_update()` (impl's staging signal). It plans with
  the documented plan cache (`enable_cache=True`, a cache of its own), as a trainer whose state dict keeps its
  structure from save to save does: a save after the first skips the global planning (one all-reduce of a flag
  instead of a gather and a scatter of every rank's plan).
  `dcp:impl-overlapped-clone` (CUDA only): with `device_clone=True`, the staging signal waits for a clone on the
  device, not for the device-to-host copy, which goes on in the background.
- `torch:impl`, `torch:nvrx` (+ `-temporal`): TorchAsyncCheckpoint. `torch:mcore` (+ `-temporal`):
  Megatron-Core's AsyncCallsQueue running `torch.save` (Megatron has no TorchAsyncCheckpoint).
- `dcp:async_save-thread` / `-process` / `-pinned` / `-staged`: `torch.distributed.checkpoint.async_save`
  with the thread or process executor; `-pinned` stages into a pinned buffer (needs CUDA); `-staged` stages in the background through a
  DefaultStager (shared memory, pinned on a GPU; the `dcp-staged` target's configuration), and the
  trainer waits for the staging in `before_update()`, as the documented contract asks.
- `dcp:save`, `torch:save`: the synchronous baselines.
- `protocol:TARGET`: any target's or adapter's protocol saver (ckptspec/bench/adapter_peer.py); CI's regression pass
  measures the one of `--impl` (`dcp:impl` for impl).

Targets are loaded with `load_target`, so NVRx and Megatron-Core get the adapters' CPU neutralisation.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from functools import partial
from time import perf_counter

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from ckptspec.bench.adapter_peer import protocol_peer
from ckptspec.bench.dcp_stager import KeptStager, staging_options
from ckptspec.bench.peer_api import Peer
from ckptspec.spec.harness import MissingCapability, load_target
from ckptspec.spec.harness.surface.loading import TargetError
from ckptspec.spec.harness.surface.recipe import plan_async_save, recipe_modules

__all__ = ["PEERS", "Peer", "make_peer", "plan_write", "unavailable"]


def plan_write(target_name: str, state_dict, path: str, *, plan_kwargs: dict | None = None, **writer_kwargs):
    """The documented recipe's planned save (ckptspec.spec.harness.surface.recipe) with the target's FileSystemWriterAsync;
    `plan_kwargs`: more keyword arguments of save_state_dict_async_plan."""
    modules = recipe_modules(load_target(target_name))
    return plan_async_save(modules, state_dict, path, plan_kwargs=plan_kwargs, **writer_kwargs)


class _WriterPeer(Peer):
    family = "dcp"

    def __init__(
        self,
        target_name: str,
        persistent: bool,
        queue_options: dict | None = None,
        cached_plan: bool = False,
        **writer_kwargs,
    ):
        self._target_name, self._writer_kwargs = target_name, writer_kwargs
        target = load_target(target_name)
        self._core = target.module("async_ckpt.core")
        self._queue = self._core.AsyncCallsQueue(persistent=persistent, **(queue_options or {}))
        self._plan_kwargs = {}
        if cached_plan:
            cache = target.module("async_ckpt.state_dict_saver").CheckpointMetadataCache()
            self._plan_kwargs = {"enable_cache": True, "metadata_cache": cache}
        # impl's staging signal (a no-op unless the queue stages in the background); other targets have none
        self._staging_wait = getattr(self._queue, "wait_for_staging", None)

    def save(self, state_dict, path):
        start = perf_counter()
        request = plan_write(
            self._target_name, state_dict, path, plan_kwargs=self._plan_kwargs, **self._writer_kwargs
        ).request()
        planned = perf_counter()
        self._queue.schedule_async_request(request)
        return {"plan": planned - start, "schedule": perf_counter() - planned}

    def before_update(self):
        if self._staging_wait is not None:
            self._staging_wait()

    def poll(self):
        self._queue.maybe_finalize_async_calls(blocking=False, no_dist=False)
        return self._queue.get_num_unfinalized_calls() > 0

    def wait(self):
        self._queue.maybe_finalize_async_calls(blocking=True, no_dist=False)

    def close(self):
        self._queue.close()


class _TorchAsyncPeer(Peer):
    family, durable = "torch", False

    def __init__(self, target_name: str, persistent: bool):
        self._schedule: Callable[[dict, str], object]
        target = load_target(target_name)
        if target.has("torch_async_checkpoint"):
            ckpt = target.module("async_ckpt.torch_ckpt").TorchAsyncCheckpoint(persistent_queue=persistent)
            own_fn = vars(ckpt).get("async_fn", vars(type(ckpt)).get("async_fn"))
            self._schedule = partial(_async_save_with_own_fn, ckpt, own_fn)
            self._finalize = partial(ckpt.finalize_async_save, blocking=False)
            # TorchAsyncCheckpoint says nothing of its calls in flight (NVRx 0.4.1 returns None from
            # finalize_async_save); its queue does, under the same name in impl and NVRx.
            self._unfinalized = ckpt._async_calls_queue.get_num_unfinalized_calls
            self._wait = partial(ckpt.finalize_async_save, blocking=True)
            self._close = partial(ckpt.finalize_async_save, blocking=True, terminate=True)
        else:  # Megatron-Core: its queue with the request TorchAsyncCheckpoint would build
            core = target.module("async_ckpt.core")
            queue = core.AsyncCallsQueue(persistent=persistent)
            self._schedule = lambda sd, path: queue.schedule_async_request(
                core.AsyncRequest(torch.save, (sd, path), [])
            )
            self._finalize = partial(queue.maybe_finalize_async_calls, blocking=False, no_dist=True)
            self._unfinalized = queue.get_num_unfinalized_calls
            self._wait = partial(queue.maybe_finalize_async_calls, blocking=True, no_dist=True)
            self._close = queue.close

    def save(self, state_dict, path):
        start = perf_counter()
        self._schedule(state_dict, path)
        return {"schedule": perf_counter() - start}

    def poll(self):
        self._finalize()
        return self._unfinalized() > 0

    def wait(self):
        self._wait()

    def close(self):
        self._close()


def _async_save_with_own_fn(ckpt, async_fn, state_dict, path):
    """ckpt.async_save, with the async_fn that ckpt's constructor chose.

    NVRx 0.4.1 keeps async_fn on the class and every constructor reassigns it, so a persistent
    instance built before a temporal one would send the temporal one's unpicklable wrapper and
    hang (a known divergence, spec clause on independent instances). The benchmark compares
    each instance as a process holding only that instance would run it.
    """
    if "async_fn" in vars(type(ckpt)) and "async_fn" not in vars(ckpt):
        type(ckpt).async_fn = async_fn
    ckpt.async_save(state_dict, path)


class _DcpAsyncSavePeer(Peer):
    family = "dcp"

    def __init__(self, executor: str, pinned: bool = False, staged: bool = False):
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        self._executor = AsyncCheckpointerType(executor)
        # Kept across saves where the torch release allows it (ckptspec/bench/dcp_stager.py): the staging buffer is
        # allocated by the first save and reused.
        self._stager = KeptStager(staging_options(pinned, staged)) if pinned or staged else None
        self._future: Future | None = None
        self._staging: Future | None = None

    def save(self, state_dict, path):
        start = perf_counter()
        stager = self._stager.for_save() if self._stager is not None else None
        response = dcp.async_save(
            state_dict, checkpoint_id=path, async_checkpointer_type=self._executor, async_stager=stager
        )
        # A staged save answers an AsyncSaveResponse; the others answer the upload future itself.
        if isinstance(response, AsyncSaveResponse):
            self._staging, self._future = response.staging_completion, response.upload_completion
        else:
            self._future = response
        if self._stager is not None:
            self.note = self._stager.note
        return {"schedule": perf_counter() - start}

    def before_update(self):
        if self._staging is not None:
            self._staging.result()
            self._staging = None

    def poll(self):
        if self._future is not None and self._future.done():
            self.wait()  # raises what the save raised
        return self._future is not None

    def wait(self):
        if self._future is not None:
            self._future.result()
            self._future = None

    def close(self):
        self.wait()
        if self._stager is not None:
            self._stager.close()
        if self._executor.value == "process":
            _stop_dcp_checkpoint_process()


def _stop_dcp_checkpoint_process() -> None:
    """Stop torch's checkpoint process, so that the next process-executor save starts a fresh one.

    torch keeps it in a module global and offers no public way to stop it; its own destructor
    sends the termination request.
    """
    from torch.distributed.checkpoint import _async_process_executor as executor

    process, executor._CHECKPOINT_PROCESS = executor._CHECKPOINT_PROCESS, None
    if process is not None:
        process.__del__()


class _SyncDcpPeer(Peer):
    family, synchronous = "dcp", True

    def save(self, state_dict, path):
        start = perf_counter()
        dcp.save(state_dict, checkpoint_id=path)
        return {"save": perf_counter() - start}


class _SyncTorchPeer(Peer):
    family, durable, synchronous = "torch", False, True

    def save(self, state_dict, path):
        start = perf_counter()
        torch.save(state_dict, path)
        return {"save": perf_counter() - start}


PEERS: dict[str, Callable[[], Peer]] = {
    "dcp:impl": partial(_WriterPeer, "impl", True),
    "dcp:impl-temporal": partial(_WriterPeer, "impl", False),
    "dcp:impl-overlapped": partial(_WriterPeer, "impl", True, {"overlap_staging": True}, cached_plan=True),
    "dcp:impl-overlapped-clone": partial(
        _WriterPeer, "impl", True, {"overlap_staging": True, "device_clone": True}, cached_plan=True
    ),
    "dcp:nvrx": partial(_WriterPeer, "nvrx", True),
    "dcp:nvrx-temporal": partial(_WriterPeer, "nvrx", False),
    "dcp:async_save-thread": partial(_DcpAsyncSavePeer, "thread"),
    "dcp:async_save-process": partial(_DcpAsyncSavePeer, "process"),
    "dcp:async_save-pinned": partial(_DcpAsyncSavePeer, "thread", pinned=True),
    "dcp:async_save-staged": partial(_DcpAsyncSavePeer, "thread", staged=True),
    "dcp:save": _SyncDcpPeer,
    "torch:impl": partial(_TorchAsyncPeer, "impl", True),
    "torch:impl-temporal": partial(_TorchAsyncPeer, "impl", False),
    "torch:nvrx": partial(_TorchAsyncPeer, "nvrx", True),
    "torch:nvrx-temporal": partial(_TorchAsyncPeer, "nvrx", False),
    "torch:mcore": partial(_TorchAsyncPeer, "mcore", True),
    "torch:mcore-temporal": partial(_TorchAsyncPeer, "mcore", False),
    "torch:save": _SyncTorchPeer,
}

_MODULES = {  # spec modules a target-based peer needs, by family
    "dcp": ("async_ckpt.core", "async_ckpt.filesystem_async", "async_ckpt.state_dict_saver"),
    "torch": ("async_ckpt.core",),
}


def unavailable(name: str) -> str | None:
    """Why peer `name` cannot run here, or None."""
    if name.startswith("protocol:"):  # ckptspec/bench/adapter_peer.py: any target's protocol saver
        try:
            load_target(name.removeprefix("protocol:")).adapter  # noqa: B018 (loading it is the check)
        except (ImportError, MissingCapability, TargetError) as exc:
            return f"{name} is not available: {exc}"
        return None
    if name not in PEERS:
        return f"unknown peer {name!r}; known: {', '.join(PEERS)}"
    if name == "dcp:async_save-pinned" and not torch.cuda.is_available():
        return "pinned-memory staging of dcp.async_save needs CUDA"
    if name == "dcp:impl-overlapped-clone" and not torch.cuda.is_available():
        return "a device clone needs CUDA tensors (on the CPU this peer is dcp:impl-overlapped)"
    family, method = name.split(":")
    target_name = method.split("-")[0]
    if target_name not in ("impl", "nvrx", "mcore"):
        return None
    try:
        target = load_target(target_name)
        for module in _MODULES[family]:
            target.module(module)
    except (ImportError, MissingCapability) as exc:
        return f"{name} is not available: {exc}"
    return None


def make_peer(name: str) -> Peer:
    """A new instance of peer `name` (check `unavailable(name)` first); `protocol:TARGET` is TARGET's protocol
    saver (ckptspec/bench/adapter_peer.py)."""
    if name.startswith("protocol:"):
        peer: Peer = protocol_peer(name.removeprefix("protocol:"))
        peer.name = name
        return peer
    peer = PEERS[name]()
    peer.name = name
    return peer
