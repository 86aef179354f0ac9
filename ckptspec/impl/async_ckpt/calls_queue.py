"""``AsyncCallsQueue``: hands requests to a caller and finalizes them in schedule order.

Contract (signature-compatible with NVRx ``async_ckpt.core``):

* Methods must be called by all ranks in the same order. The "world" is ``torch.distributed``
  when initialized, else this process alone (no collectives at all).
* Indices are consecutive from 0 and only consumed by successful schedules. Finalization is
  head-of-line: a request is finalized only once it and every older one are done on all ranks.
* ``AsyncCallsQueue(overlap_staging=True)`` (impl's extension, persistent only) schedules through an
  ``OverlappedAsyncCaller`` (``overlap``): scheduling returns once the copies are issued, and the trainer calls
  ``wait_for_staging()`` before it next changes the saved tensors. The default stages before scheduling returns.
* A failure (in async_fn / preload_fn / a finalize fn, or a dead worker) raises
  ``CheckpointException`` on every rank. The failed request is dropped: never retried, its
  finalize fns do not run (after a failing finalize fn, the remaining ones are skipped). Later
  requests stay queued.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util as mp_util
import os
import sys
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException

from ..utils import all_reduce, dist_ready, paused_gc, picklable_error
from .callers import AsyncCaller, PersistentAsyncCaller, TemporalAsyncCaller
from .overlap import OverlappedAsyncCaller
from .request import AsyncRequest, raise_failure

__all__ = ["AsyncCallsQueue", "abort_nvrx_checkpoint"]

logger = logging.getLogger(__name__)

# The queues of this process (a forked child inherits its parent's, which are not its own to finalize).
_open_queues: weakref.WeakSet[AsyncCallsQueue] = weakref.WeakSet()
_open_queues_pid: int | None = None

# P-EXIT-2 gives interpreter exit 30 s: calls still running here after this long are aborted, not waited for.
_EXIT_WAIT_S = 20.0


def _track_open(queue: AsyncCallsQueue) -> None:
    """Finalize `queue` at the end of this process if it is still open. A process started by multiprocessing
    (torch.multiprocessing.spawn ranks) never runs atexit hooks, only multiprocessing's exit finalizers: the hook
    is one of those too, ahead of the callers' abort (priority 10); run twice, it finds nothing the second time."""
    global _open_queues, _open_queues_pid
    if os.getpid() != _open_queues_pid:
        _open_queues, _open_queues_pid = weakref.WeakSet(), os.getpid()
        mp_util.Finalize(None, _close_open_queues, exitpriority=20)
    _open_queues.add(queue)


@atexit.register
def _close_open_queues() -> None:
    """A trainer that ends without close() still gets its saves in flight finalized (protocol clause P-EXIT-2),
    unless they have not finished here within _EXIT_WAIT_S: those are aborted (logged), so exit never hangs."""
    if os.getpid() != _open_queues_pid:
        return
    deadline = time.monotonic() + _EXIT_WAIT_S
    for queue in list(_open_queues):
        if queue.get_num_unfinalized_calls():
            try:
                if queue._finished_here_by(deadline):
                    queue.close()
                else:
                    logger.error(
                        "%d async checkpoint call(s) still running %g s into interpreter exit: aborted, not finalized",
                        queue.get_num_unfinalized_calls(),
                        _EXIT_WAIT_S,
                    )
                    queue.close(abort=True)
            except BaseException:
                logger.exception("finalizing the calls in flight at interpreter exit failed")


def abort_nvrx_checkpoint() -> None:
    """Close every open AsyncCallsQueue of this process with ``abort=True`` (NVRx 0.7.0's name for it): their
    background processes are killed and their pending calls dropped without finalizing. A closed queue stays
    closed: later saves go through a new queue."""
    if os.getpid() == _open_queues_pid:
        for queue in list(_open_queues):
            queue.close(abort=True)


class _ActiveAsyncRequest(NamedTuple):
    """A scheduled request: queue index, the caller running it, and the frozen request."""

    idx: int
    async_caller: AsyncCaller
    async_request: AsyncRequest


def _as_async_request(request: Any) -> AsyncRequest:
    if isinstance(request, AsyncRequest):
        return request
    if isinstance(request, tuple) and getattr(request, "_fields", None) == AsyncRequest._fields:
        return AsyncRequest(*request)
    raise TypeError(f"expected an AsyncRequest, got {type(request).__name__}")


def _check_bools(**flags: Any) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


class AsyncCallsQueue:
    """Schedules AsyncRequests and finalizes them in order on all ranks.

    Persistent queues share one PersistentAsyncCaller; temporal queues use one caller per request.
    ``overlap_staging`` and ``device_clone`` (impl only, keyword-only) choose overlapped staging (module docstring).
    """

    def __init__(self, persistent: bool = True, *, overlap_staging: bool = False, device_clone: bool = False):
        _check_bools(overlap_staging=overlap_staging, device_clone=device_clone)
        if (overlap_staging or device_clone) and not persistent:
            raise ValueError("overlap_staging and device_clone need a persistent queue (a temporal one forks)")
        if device_clone and not overlap_staging:
            raise ValueError("device_clone needs overlap_staging=True")
        self.persistent = persistent
        self.overlap_staging, self.device_clone = overlap_staging, device_clone
        self._pending: deque[_ActiveAsyncRequest] = deque()
        self._next_idx = 0
        self._persistent_caller: PersistentAsyncCaller | None = None
        self._warned_temporal = False
        self._closed = False
        _track_open(self)

    @paused_gc()
    def schedule_async_request(self, async_request: AsyncRequest) -> int:
        """Start ``async_request`` in the background; return its queue index. On all ranks."""
        request = _as_async_request(async_request)
        if self._closed:
            raise RuntimeError("AsyncCallsQueue is closed")
        idx = self._next_idx
        frozen = request.freeze()._replace(call_idx=idx)
        caller = self._get_async_caller()
        caller.schedule_async_call(frozen._replace(finalize_fns=[]))
        self._pending.append(_ActiveAsyncRequest(idx, caller, frozen))
        self._next_idx += 1
        return idx

    def maybe_finalize_async_calls(self, blocking: bool = False, no_dist: bool = False) -> list[int]:
        """Finalize requests done on all ranks, oldest first; return their queue indices.

        Stops at the first request not done yet (all of them are waited for if ``blocking``).
        Raises CheckpointException on all ranks when a request or its finalization failed.
        """
        _check_bools(blocking=blocking, no_dist=no_dist)
        finalized = []
        while self._pending:
            head = self._pending[0]
            try:
                done = head.async_caller.is_current_async_call_done(blocking, no_dist)
            except CheckpointException:
                self._retire(self._pending.popleft())
                raise
            if not done:
                break
            self._retire(self._pending.popleft())
            self._finalize(head, no_dist)
            finalized.append(head.idx)
        return finalized

    def _pending_callers(self) -> dict[int, AsyncCaller]:
        """The distinct callers of the pending requests, by identity (a persistent caller serves many)."""
        return {id(entry.async_caller): entry.async_caller for entry in self._pending}

    def _finished_here_by(self, deadline: float) -> bool:
        """Whether this rank's pending calls all finish here by `deadline` (time.monotonic); local, finalizes nothing."""
        return all(caller._finished_here_by(deadline) for caller in self._pending_callers().values())

    def wait_for_staging(self) -> None:
        """Return once the trainer may change the tensors of every request scheduled so far (impl's staging signal).

        At once unless ``overlap_staging``: then scheduling itself took the snapshot. Local: no collective."""
        if isinstance(self._persistent_caller, OverlappedAsyncCaller):
            self._persistent_caller.wait_for_staging()

    def get_num_unfinalized_calls(self) -> int:
        """Number of requests scheduled but not finalized yet."""
        return len(self._pending)

    def close(self, abort: bool = False) -> None:
        """Finalize pending requests (on all ranks) and stop the callers; idempotent.

        With ``abort`` the background processes are killed and pending requests dropped
        without running their finalize functions. Either way the queue is closed afterwards.
        """
        if self._closed:
            return
        if abort:
            self._abort()
            return
        try:
            first_failure = self._finalize_all()
        except BaseException:
            self._abort()
            raise
        self._closed = True
        if self._persistent_caller is not None:
            self._persistent_caller.close()
        if first_failure is not None:
            raise first_failure

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # Once the interpreter is finalizing, module globals may already be None: the exit hooks have finalized or
        # aborted every open queue by then (_close_open_queues, the callers' abort), so there is nothing left to do.
        if _finalizing() or getattr(self, "_closed", True):
            return
        if self._pending:
            logger.warning(
                "AsyncCallsQueue garbage-collected with %d unfinalized calls; aborting them",
                len(self._pending),
            )
        self.close(abort=True)

    def _get_async_caller(self) -> AsyncCaller:
        if not self.persistent:
            if not self._warned_temporal:
                logger.warning("TemporalAsyncCaller is deprecated; use a persistent queue")
                self._warned_temporal = True
            return TemporalAsyncCaller()
        if self._persistent_caller is None:
            self._persistent_caller = (
                OverlappedAsyncCaller(self.device_clone) if self.overlap_staging else PersistentAsyncCaller()
            )
        return self._persistent_caller

    def _retire(self, entry: _ActiveAsyncRequest) -> None:
        """Release a temporal caller once its only request is reported."""
        if entry.async_caller is not self._persistent_caller:
            entry.async_caller.close()

    def _finalize(self, entry: _ActiveAsyncRequest, no_dist: bool) -> None:
        """Run the finalize fns; check (collectively) that all ranks finalized the same call."""
        err = None
        for fn in entry.async_request.finalize_fns:
            try:
                fn()
            except Exception as exc:
                err = picklable_error(exc)
                break
        collective = not no_dist and dist_ready()
        failed = err is not None
        if collective:
            values = [entry.idx, -entry.idx, int(failed)]
            top, neg_bottom, any_failed = all_reduce(values, dist.ReduceOp.MAX, torch.int64)
            failed = bool(any_failed)
            if (top, -neg_bottom) != (entry.idx, entry.idx):
                raise RuntimeError(
                    f"ranks finalized different calls: this rank finalized {entry.idx}, "
                    f"others range from {-neg_bottom} to {top}"
                )
        if failed:
            raise_failure("async checkpoint finalization", err, collective)

    def _finalize_all(self) -> BaseException | None:
        """Finalize every pending request (blocking); return the first failure, if any."""
        first_failure = None
        while self._pending:
            try:
                self.maybe_finalize_async_calls(blocking=True, no_dist=False)
            except CheckpointException as exc:
                if first_failure is None:
                    first_failure = exc
        return first_failure

    def _abort(self) -> None:
        self._closed = True
        callers = self._pending_callers()
        if self._persistent_caller is not None:
            callers[id(self._persistent_caller)] = self._persistent_caller
        self._pending.clear()
        for caller in callers.values():
            caller.close(abort=True)
