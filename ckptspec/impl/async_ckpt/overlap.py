"""Overlapped staging: a persistent caller whose schedule returns once the copies of a request's tensors are issued.

Contract (an impl extension; NVRx's request and queue shapes are unchanged):

* ``OverlappedAsyncCaller`` is a ``PersistentAsyncCaller`` (same worker, pipe and slab pool) whose
  ``schedule_async_call`` lays the request's tensors out in a slab (``staging.lay_out``) and returns without
  copying them. CPU tensors are copied by the caller's staging thread. CUDA tensors are copied on a side stream of
  their device, ordered after the trainer's current stream (``wait_stream``: an event), into the slab, page-locked
  once (the pool reuses it across saves; ``close`` unpins and frees it). With ``device_clone`` each CUDA tensor is
  first cloned on the device, at device bandwidth, and the device-to-host copy reads the clone.
* ``wait_for_staging()`` is the staging signal: once it returns, the trainer may change every tensor of the
  requests scheduled so far. For CPU tensors it waits for the staging thread's copies; for CUDA tensors it makes
  the trainer's current stream wait (on the device, the host does not block, also when a request holds CUDA
  tensors only) for the copies, or for the clones.
  Changing a tensor before it is a race: the checkpoint may hold the old or the new value of each element.
* A request reaches the worker once its slab is complete, sent by the staging thread, in schedule order.
  A copy that fails fails its request (reported by the next completion check); nothing is sent for it.
* A ``preload_fn`` marked ``staging.copies_to_host`` (the writer's ``preload_tensors``) is dropped and its
  argument staged with the rest; any other preload runs in the worker as ``PersistentAsyncCaller`` runs it, and
  scheduling waits for it.
* Memory: each request in flight holds one slab of its tensors' bytes (each tensor 64-byte aligned); the pool
  keeps finished requests' slabs for reuse until ``close``, at most ``SlabPool.MAX_FREE`` of them (``staging``). With ``device_clone``, one device clone of the CUDA
  tensors per request, freed once its device-to-host copy is done.
* ``close`` waits for the staging thread to send what it holds, then closes as ``PersistentAsyncCaller`` does;
  ``close(abort=True)`` lets the copy in progress end (bounded by memory bandwidth), copies and sends nothing more.
  A slab returns to the pool only once no copy touches it (a request failed by a dead worker waits for its copy).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import torch

from ..phases import mark
from ..utils import picklable_error
from .callers import PersistentAsyncCaller
from .request import AsyncRequest
from .staging import LANDED_ALL, Slab, Staged, lay_out, side_stream

__all__ = ["OverlappedAsyncCaller"]

logger = logging.getLogger(__name__)

_JOIN_S = 30.0  # the staging thread ends its copy in progress within this (a copy runs at memory bandwidth)


@dataclass
class _Staging:
    """One request whose copies are in flight: what the staging thread finishes and sends."""

    idx: int
    message: tuple[int, bool, bytes, int | None]
    slab: Slab | None
    cpu: list[tuple[torch.Tensor, Staged]]
    # (device, event) pairs: the trainer's stream waits for each before it changes the CUDA tensors
    snapshot_events: list[tuple[torch.device, Any]] = field(default_factory=list)
    host_events: list[Any] = field(default_factory=list)  # the slab holds the CUDA tensors' bytes once all happened
    clones: list[torch.Tensor] = field(default_factory=list)
    cpu_copied: threading.Event = field(default_factory=threading.Event)
    copied: threading.Event = field(default_factory=threading.Event)  # no copy will touch the slab any more

    def __post_init__(self) -> None:
        if not self.cpu:  # nothing for the host to copy: the staging signal waits on the device only
            self.cpu_copied.set()


class OverlappedAsyncCaller(PersistentAsyncCaller):
    """A PersistentAsyncCaller that stages in the background (see the module docstring)."""

    def __init__(self, device_clone: bool = False) -> None:
        super().__init__()
        self.device_clone = device_clone
        self._send_lock = threading.RLock()  # the staging thread and the trainer both send on the pipe
        self._inbox: queue.SimpleQueue[_Staging | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._unsignalled: dict[int, _Staging] = {}  # scheduled, not yet covered by a wait_for_staging
        self._staging: dict[int, _Staging] = {}  # in flight: its slab goes back to the pool once `copied`
        self._copy_failures: list[tuple[int, BaseException]] = []  # appended by the staging thread
        self._aborting = False

    def schedule_async_call(self, async_req: AsyncRequest) -> None:
        idx = async_req.call_idx
        if async_req.async_fn is None:
            self._results[idx] = None
            self._pending.append(idx)
            return
        request, slab, layout = lay_out(async_req, self._pool, stage_preloads=True)
        try:
            body = self._pickler.dumps(request)
        except Exception as exc:
            self._pool.give(slab)
            raise TypeError(f"AsyncRequest cannot be sent to the checkpoint worker: {exc}") from exc
        self._ensure_worker()
        wants_ack = request.preload_fn is not None
        message = (idx, wants_ack, body, None if slab is None else slab.nbytes)
        staging = _Staging(idx, message, slab, [(t, p) for t, p in layout if not t.is_cuda])
        cuda = [(t, p) for t, p in layout if t.is_cuda]
        if cuda:
            assert slab is not None  # every staged tensor has its place in the slab
            self._issue_cuda_copies(staging, slab, cuda)
        self._pending.append(idx)
        self._in_flight[idx] = slab
        self._unsignalled[idx] = staging
        self._staging[idx] = staging
        self._start_thread()
        self._inbox.put(staging)
        if wants_ack:
            self._wait_for_preload(idx)

    def wait_for_staging(self) -> None:
        """Return once the trainer may change the tensors of every request scheduled so far (module docstring)."""
        for idx in list(self._unsignalled):
            staging = self._unsignalled.pop(idx)
            staging.cpu_copied.wait()  # the thread sets it whatever happens to the copy
            for device, event in staging.snapshot_events:
                torch.cuda.current_stream(device).wait_event(event)

    def close(self, abort: bool = False) -> None:
        self._stop_thread(abort)
        self._unsignalled.clear()
        super().close(abort)
        self._staging.clear()

    # ------------------------------------------------------------------------------------- helpers

    def _issue_cuda_copies(self, staging: _Staging, slab: Slab, pairs: list[tuple[torch.Tensor, Staged]]) -> None:
        """Queue the copies of the CUDA tensors on each device's side stream, after the trainer's work so far."""
        slab.pin()  # once per slab: non-blocking copies into it then run at page-locked speed
        devices: dict[torch.device, list[tuple[torch.Tensor, Staged]]] = {}
        for t, place in pairs:
            devices.setdefault(t.device, []).append((t, place))
        for device, items in devices.items():
            side = side_stream(device)
            with torch.cuda.stream(side):
                if self.device_clone:
                    sources = [t.detach().clone() for t, _ in items]  # allocated on, and freed for, the side stream
                    staging.clones.extend(sources)
                    staging.snapshot_events.append((device, _recorded(side)))
                else:
                    sources = [t.detach() for t, _ in items]
                    for t in sources:
                        t.record_stream(side)  # its memory is not reused while the copy may still read it
                for src, (_, place) in zip(sources, items, strict=True):
                    slab.region(place).copy_(src, non_blocking=True)
                host = _recorded(side)
            staging.host_events.append(host)
            if not self.device_clone:
                staging.snapshot_events.append((device, host))

    def _start_thread(self) -> None:
        if self._thread is None:
            self._aborting = False
            self._thread = threading.Thread(target=self._stage_loop, name="ckpt-staging", daemon=True)
            self._thread.start()

    def _stop_thread(self, abort: bool) -> None:
        if self._thread is None:
            return
        self._aborting = abort
        self._inbox.put(None)
        self._thread.join(_JOIN_S)
        self._thread = None

    def _stage_loop(self) -> None:
        """The staging thread: finish each request's copies, in order, and send it to the worker."""
        while (staging := self._inbox.get()) is not None:
            try:
                if not self._aborting:
                    mark("copies")
                    self._finish_copies(staging)
                    mark("snapshot")
            except Exception as exc:
                self._copy_failures.append((staging.idx, picklable_error(exc)))
                continue
            finally:
                staging.cpu_copied.set()
                staging.copied.set()  # before the send lock: _complete may wait for this while holding it
            with self._send_lock:
                # Not sent if aborted, or already failed (a dead worker): its index is no longer in flight.
                if not self._aborting and staging.idx in self._in_flight and self._process is not None:
                    if staging.slab is not None:
                        staging.slab.set_progress(LANDED_ALL)  # sent complete: the worker need not wait
                    self._send(staging.message, None if staging.slab is None else staging.slab.fd)
                    mark("handed over")
            staging.message = (staging.idx, False, b"", None)  # the pickled request is not needed any more

    def _finish_copies(self, staging: _Staging) -> None:
        if staging.cpu:
            for t, place in staging.cpu:
                assert staging.slab is not None  # every staged tensor has its place in the slab
                staging.slab.write(place, t)
            staging.cpu.clear()  # drop the references to the trainer's tensors
        staging.cpu_copied.set()  # before the device-to-host copies end: the trainer's stream waits for those
        for event in staging.host_events:
            event.synchronize()
        staging.clones.clear()

    def _send(self, message: tuple[int, bool, bytes, int | None] | None, slab_fd: int | None = None) -> None:
        with self._send_lock:
            super()._send(message, slab_fd)

    def _ensure_worker(self) -> None:
        with self._send_lock:  # a worker restarted here is never one the staging thread is sending to
            super()._ensure_worker()

    def _complete(self, idx: int, err: BaseException | None) -> None:
        # A request failed by a dead worker may still be copied into: its slab returns to the pool (and may be
        # taken by the next save) only once no copy touches it. Bounded: each copy runs at memory bandwidth.
        staging = self._staging.pop(idx, None)
        if staging is not None and not staging.copied.wait(_JOIN_S):
            logger.error("checkpoint call %d: its staging copies did not end within %g s", idx, _JOIN_S)
            self._in_flight.pop(idx, None)  # the slab is dropped, never reused while a copy may still run
        super()._complete(idx, err)

    def _poll(self, timeout: float) -> None:
        while self._copy_failures:
            idx, err = self._copy_failures.pop(0)
            if idx in self._in_flight:
                self._complete(idx, err)
        super()._poll(timeout)


def _recorded(stream: Any) -> Any:
    event = torch.cuda.Event()
    event.record(stream)
    return event
