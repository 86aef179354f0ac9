"""Callers: run scheduled requests in background processes and tell when the oldest one is done.

Contract (signature-compatible with NVRx ``async_ckpt.core``):

* Completion check: exactly one all-reduce (SUM) of one int32 per check, packing
  ``alive + failed * (world_size + 1)`` so every rank learns both "some rank still running" and
  "some rank failed". Errors are gathered (``all_gather_object``) only on failure, and then
  ``CheckpointException`` is raised on every rank. ``no_dist`` (or no torch.distributed) checks
  this rank alone, without any collective.
* ``TemporalAsyncCaller`` (deprecated) forks one child per request, so CPU tensors are
  copy-on-write; preload_fn runs in the trainer and GPU tensors go to host first. Scheduling
  returns once the child runs: one stuck inside its fork is killed and forked again (TC-3).
* ``PersistentAsyncCaller``: one spawned, non-daemonic worker (own process group) serving
  requests FIFO over a Pipe. Tensors are staged into shared memory (see ``staging``) before
  scheduling returns; requests are pickled in the trainer, so an unpicklable request raises
  TypeError at schedule time. A worker found dead is restarted by the next schedule.
* Children and workers die with the trainer (see ``worker``), and an exit hook aborts those
  still running when the trainer exits.
"""

from __future__ import annotations

import contextlib
import io
import logging
import pickle
import sys
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from multiprocessing import connection, get_context
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler, send_handle
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing  # registers torch's tensor reductions with ForkingPickler
from torch.distributed.checkpoint.planner import WriteItem

from ..phases import mark
from ..utils import all_reduce, dist_ready
from .process_reaping import kill_group, track_live, untrack_live
from .request import AsyncRequest, raise_failure, run_guarded
from .staging import Slab, SlabPool, copy_in, lay_out, map_tensors, writer_may_overlap
from .worker import STARTED, persistent_worker, temporal_child

__all__ = ["AsyncCaller", "PersistentAsyncCaller", "TemporalAsyncCaller"]

logger = logging.getLogger(__name__)

_POLL_S = 0.1  # blocking waits wake up this often to recheck worker liveness
_SHUTDOWN_S = 10.0  # an idle worker told to exit has this long (PC-4's bound for a worker to go) before it is killed
# A forked child normally reaches Python within milliseconds. CPython before 3.11.10 (and 3.12) can leave it
# blocked forever inside fork itself, on an interpreter lock another thread held at that instant (gh-112275):
# such a child has run nothing, so it is killed and the call forked again, a bounded number of times.
_START_S = 10.0
_FORK_TRIES = 3


# ---------------------------------------------------------------------------------------------
# Callers


class AsyncCaller(ABC):
    """Runs scheduled requests in the background and tells when the oldest one is done.

    Subclasses keep ``_pending`` (indices scheduled, not yet reported done, oldest first) and
    fill ``_results`` (index -> error or None) from ``_poll`` as requests finish locally.
    """

    def __init__(self) -> None:
        self._pending: deque[int] = deque()
        self._results: dict[int, BaseException | None] = {}

    @abstractmethod
    def schedule_async_call(self, async_req: AsyncRequest) -> None:
        """Start ``async_req`` in the background. Called on all ranks."""

    @abstractmethod
    def is_current_async_call_done(self, blocking: bool = False, no_dist: bool = False) -> bool:
        """Whether the oldest unreported request is done on all ranks (this rank if no_dist).

        Raises CheckpointException (on all ranks) if it is done everywhere and failed anywhere.
        """

    def _finished_here_by(self, deadline: float) -> bool:
        """Wait until `deadline` (time.monotonic) for this rank's unreported requests to finish here; whether they
        all did. Local only: no collective, nothing reported or finalized."""
        while True:
            self._poll(min(_POLL_S, max(0.0, deadline - time.monotonic())))
            if all(idx in self._results for idx in self._pending):
                return True
            if time.monotonic() >= deadline:
                return False

    def sync_all_async_calls(self, is_alive: int) -> bool:
        """True iff no rank reports ``is_alive`` (one all-reduce SUM of one int)."""
        if not dist_ready():
            return not is_alive
        return all_reduce([int(is_alive)], dist.ReduceOp.SUM)[0] == 0

    @abstractmethod
    def close(self, abort: bool = False) -> None:
        """Stop the background process(es): wait for them, or kill them if ``abort``."""

    def __del__(self, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # Never a collective here: a caller collected while still running is simply aborted. Once the interpreter
        # is finalizing, module globals may already be None, so nothing is done: the exit hook has aborted every
        # caller with a process by then, and a process it missed dies with its lifeline when this process ends.
        if not _finalizing():
            self.close(abort=True)

    @abstractmethod
    def _poll(self, timeout: float) -> None:
        """Record requests that finished locally, waiting up to ``timeout`` seconds."""

    def _check_done(self, blocking: bool, no_dist: bool) -> bool:
        head = self._pending[0] if self._pending else None
        self._poll(0)
        while blocking and head is not None and head not in self._results:
            self._poll(_POLL_S)
        done = head is None or head in self._results
        err = None if head is None else self._results.get(head)
        failed = err is not None
        collective = not no_dist and dist_ready()
        if collective:
            done, failed = self._sync_done_failed(done, failed)
        if not done:
            return False
        if head is not None:
            self._pending.popleft()
            del self._results[head]
        if failed:
            raise_failure("async checkpoint call", err, collective)
        return True

    @staticmethod
    def _sync_done_failed(done: bool, failed: bool) -> tuple[bool, bool]:
        """Global (all done, any failed) from one all-reduce of ``alive + failed*(world+1)``."""
        base = dist.get_world_size() + 1
        packed = int(not done) + int(failed) * base
        total = all_reduce([packed], dist.ReduceOp.SUM)[0]
        return total % base == 0, total >= base


class TemporalAsyncCaller(AsyncCaller):
    """Deprecated: forks one child per request (CPU tensors shared copy-on-write).

    preload_fn runs in the trainer and GPU tensors are copied to host before forking, since
    the child cannot use CUDA. The child reports its error over a pipe and exits non-zero.
    """

    def __init__(self) -> None:
        super().__init__()
        # index -> (child process, result pipe read end, lifeline write end)
        self._children: dict[int, tuple[Any, connection.Connection, connection.Connection]] = {}
        self._reported: set[int] = set()  # children whose report has been read

    def schedule_async_call(self, async_req: AsyncRequest) -> None:
        idx = async_req.call_idx
        if async_req.async_fn is None:
            self._results[idx] = None
        else:
            args, kwargs, err = self._prepare(async_req)
            if err is None:
                self._fork(idx, async_req.async_fn, args, kwargs)
            else:
                self._results[idx] = err
        self._pending.append(idx)

    def is_current_async_call_done(self, blocking: bool = False, no_dist: bool = False) -> bool:
        return self._check_done(blocking, no_dist)

    def close(self, abort: bool = False) -> None:
        for idx, (process, result_conn, lifeline) in self._children.items():
            if abort:
                kill_group(process)
            else:
                if idx not in self._reported:  # its write may take long: wait for it as long as it runs
                    connection.wait([result_conn, process.sentinel])
                _join_reported(process)
            result_conn.close()
            lifeline.close()
        self._children.clear()
        self._reported.clear()
        self._pending.clear()
        self._results.clear()
        untrack_live(self)

    @staticmethod
    def _prepare(async_req: AsyncRequest) -> tuple[list[Any], dict[str, Any], BaseException | None]:
        """Run preload_fn here and copy GPU tensors to host; return (args, kwargs, error)."""
        args = list(async_req.async_fn_args)
        if async_req.preload_fn is not None:
            args[1], err = run_guarded(async_req.preload_fn)
            if err is not None:
                return [], {}, err
        kwargs = dict(async_req.async_fn_kwargs or {})
        args, kwargs = map_tensors(_gpu_to_host, (args, kwargs))
        return args, kwargs, None

    def _fork(self, idx: int, async_fn: Callable[..., object], args: list[Any], kwargs: dict[str, Any]) -> None:
        """Fork the child of call ``idx`` and wait until it has started (TC-3); record a failure if none did."""
        ctx = get_context("fork")
        for _ in range(_FORK_TRIES):
            result_r, result_w = ctx.Pipe(duplex=False)
            lifeline_r, lifeline_w = ctx.Pipe(duplex=False)
            process = ctx.Process(
                target=temporal_child,
                args=(async_fn, args, kwargs, result_w, lifeline_r, lifeline_w),
                name=f"ckpt-temporal-{idx}",
                daemon=False,  # async_fn may start processes of its own
            )
            process.start()
            result_w.close()
            lifeline_r.close()
            if _started(result_r):
                self._children[idx] = (process, result_r, lifeline_w)
                track_live(self)
                return
            logger.error(
                "checkpoint child (pid %d) did not report running within %g s of its fork: killed",
                process.pid,
                _START_S,
            )
            kill_group(process)
            result_r.close()
            lifeline_w.close()
        self._results[idx] = RuntimeError(f"no forked child started within {_START_S:g} s, {_FORK_TRIES} tries")

    def _poll(self, timeout: float) -> None:
        idx = self._pending[0] if self._pending else None
        if idx not in self._children or idx in self._results:
            return
        process, result_conn, _ = self._children[idx]
        connection.wait([result_conn, process.sentinel], timeout)
        alive = process.is_alive()  # read before the pipe: a dead child's report is already there
        if result_conn.poll():
            try:
                self._results[idx] = result_conn.recv()
                self._reported.add(idx)
                return
            except EOFError:
                pass
        if not alive:
            self._results[idx] = RuntimeError(f"worker exited with code {process.exitcode}")


def _started(result_conn: connection.Connection) -> bool:
    """Whether a just-forked child reports, within _START_S, that it runs (the first message it sends)."""
    if not connection.wait([result_conn], _START_S):
        return False  # stuck in the fork, or dead before it ran anything
    try:
        return bool(result_conn.recv() == STARTED)
    except EOFError:
        return False


def _join_reported(process: BaseProcess) -> None:
    """Give a child that has reported (or died) _SHUTDOWN_S to exit; one that lingers (a non-daemonic thread its
    call left running, a lock inherited mid-use) is killed, logged: the call itself is done (TC-2)."""
    process.join(_SHUTDOWN_S)
    if process.is_alive():
        logger.error(
            "checkpoint child (pid %d) did not exit within %g s of its report: killed", process.pid, _SHUTDOWN_S
        )
        kill_group(process)


def _gpu_to_host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu") if t.is_cuda else t


class RequestPickler:
    """Pickles requests for the worker (``ForkingPickler``: tensors and handles as multiprocessing sends them),
    each plan item (``WriteItem``) of the previous request pickled again only if it is another object, and unpickled
    again by the worker only if its pickle differs from every item of the worker's previous request (``_item_of``).

    A repeated save (the prepared path, ``state_dict_saver``) hands the writer the same items every time: about 1 us
    each to look up instead of about 10 us to pickle, and as much again to unpickle (a state dict of 10,000 tensors:
    some 0.1 s of the trainer's call, and 0.1 s more before the worker's first byte). Items are frozen dataclasses;
    each side holds the previous request's items only.
    """

    def __init__(self) -> None:
        self._previous: dict[int, tuple[WriteItem, bytes]] = {}
        self._sent = 0

    def dumps(self, request: AsyncRequest) -> bytes:
        buffer = io.BytesIO()
        self._sent += 1
        pickler = _ItemReusingPickler(buffer, self._previous, self._sent)
        pickler.dump(request)
        self._previous = pickler.current
        return buffer.getvalue()


class _ItemReusingPickler(ForkingPickler):
    def __init__(self, file: io.BytesIO, previous: dict[int, tuple[WriteItem, bytes]], number: int):
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.previous = previous
        self.current: dict[int, tuple[WriteItem, bytes]] = {}
        self.number = number

    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is not WriteItem:
            return NotImplemented
        known = self.previous.get(id(obj))
        blob = known[1] if known is not None and known[0] is obj else pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        self.current[id(obj)] = (obj, blob)
        return _item_of, (blob, self.number)


# Worker side (one thread unpickles the requests, in order): the items of the request being unpickled and of the
# one before it, by their pickles.
_items_of_request: tuple[int, dict[bytes, WriteItem], dict[bytes, WriteItem]] = (0, {}, {})


def _item_of(blob: bytes, request: int) -> WriteItem:
    """The item pickled as ``blob`` in request number ``request``: the previous request's object when it was
    pickled the same (equal pickles make equal frozen items), else unpickled."""
    global _items_of_request
    number, current, before = _items_of_request
    if request != number:
        number, current, before = _items_of_request = (request, {}, current)
    item = current.get(blob)
    if item is None:
        item = before.get(blob)
        current[blob] = item = pickle.loads(blob) if item is None else item
    return item


class PersistentAsyncCaller(AsyncCaller):
    """One long-lived spawned worker per caller, serving requests FIFO, one at a time.

    Tensors in the request's args/kwargs are staged into a pooled shared-memory slab in the
    trainer; the worker maps the slab and uses the tensors without another copy. A preload_fn that
    only copies to host (``copies_to_host``: the writer's, for CUDA tensors) is not run: its argument
    is staged here with the rest, CUDA tensors into the pinned slab without blocking per tensor
    (``copy_in``). With another preload_fn, scheduling waits for the worker's "preloaded"
    acknowledgement (or its death).
    """

    def __init__(self) -> None:
        super().__init__()
        # The worker: process, its pipe and the lifeline's write end are all set, or all None.
        self._process: BaseProcess | None = None
        self._conn: connection.Connection | None = None
        self._lifeline: connection.Connection | None = None  # write end, held only here
        self._pool = SlabPool()
        self._pickler = RequestPickler()
        self._in_flight: dict[int, Slab | None] = {}  # sent, not done -> its slab
        self._preloaded: set[int] = set()

    def schedule_async_call(self, async_req: AsyncRequest) -> None:
        idx = async_req.call_idx
        if async_req.async_fn is None:
            self._results[idx] = None
            self._pending.append(idx)
            return
        # A preload that only copies to host (impl's writer's, for CUDA tensors) is staged here instead, into the
        # pinned slab (copy_in), not by the worker through CUDA IPC handles.
        request, slab, layout = lay_out(async_req, self._pool, stage_preloads=True)
        try:
            body = self._pickler.dumps(request)
        except Exception as exc:
            self._pool.give(slab)
            raise TypeError(f"AsyncRequest cannot be sent to the checkpoint worker: {exc}") from exc
        self._ensure_worker()
        self._pending.append(idx)
        self._in_flight[idx] = slab
        wants_ack = request.preload_fn is not None
        if slab is None:
            self._send((idx, wants_ack, body, None))
        else:
            # Sent before the copies where the writer may overlap them (staging: writer_may_overlap): the worker
            # writes each tensor once it has landed (staging: landing). Either way this call returns only once
            # every copy is made, so the snapshot is the state at the call.
            slab.set_progress(0)
            overlap = writer_may_overlap(layout)
            if overlap:
                self._send((idx, wants_ack, body, slab.nbytes), slab.fd)
                mark("handed over")
            try:
                mark("copies")
                copy_in(slab, layout)  # a failed copy fails the request in the worker too
                mark("snapshot")
            finally:
                if not overlap:
                    self._send((idx, wants_ack, body, slab.nbytes), slab.fd)
                    mark("handed over")
        if wants_ack:
            self._wait_for_preload(idx)

    def is_current_async_call_done(self, blocking: bool = False, no_dist: bool = False) -> bool:
        return self._check_done(blocking, no_dist)

    def close(self, abort: bool = False) -> None:
        if self._process is not None:
            if abort:
                kill_group(self._process)
            else:
                self._shutdown_worker()
            self._release_worker()
        for slab in self._in_flight.values():
            self._pool.give(slab)
        self._in_flight.clear()
        self._pool.clear()
        self._pending.clear()
        self._results.clear()
        untrack_live(self)

    def _ensure_worker(self) -> None:
        if self._process is not None and self._process.is_alive():
            return
        if self._process is not None:
            self._poll(0)  # marks the dead worker's in-flight requests failed
            self._release_worker()
        self._start_worker()

    def _start_worker(self) -> None:
        ctx = get_context("spawn")
        conn, worker_conn = ctx.Pipe()
        lifeline_r, lifeline_w = ctx.Pipe(duplex=False)
        process = ctx.Process(
            target=persistent_worker,
            args=(worker_conn, lifeline_r, logger.getEffectiveLevel()),
            name="ckpt-worker",
            daemon=False,  # async_fn may start processes of its own
        )
        process.start()
        worker_conn.close()
        lifeline_r.close()
        self._process, self._conn, self._lifeline = process, conn, lifeline_w
        track_live(self)
        logger.info("Started persistent checkpoint worker (pid %d)", self._process.pid)

    def _release_worker(self) -> None:
        """Close our ends of the pipes once the worker has exited (or been killed)."""
        assert self._conn is not None  # only called with a worker
        assert self._lifeline is not None
        self._conn.close()
        self._lifeline.close()
        self._process = self._conn = self._lifeline = None

    def _shutdown_worker(self) -> None:
        """Tell the idle worker to exit; one that has not within _SHUTDOWN_S is stuck, and is killed (bounded)."""
        assert self._process is not None  # only called with a worker
        self._send(None)
        deadline = time.monotonic() + _SHUTDOWN_S
        while self._process.is_alive() and time.monotonic() < deadline:
            self._poll(_POLL_S)  # keep reading, so the worker never blocks on a full pipe
        if self._process.is_alive():
            logger.error(
                "checkpoint worker (pid %d) did not exit within %g s of close(): killed", self._process.pid, _SHUTDOWN_S
            )
            kill_group(self._process)
        self._process.join()

    def _send(self, message: tuple[int, bool, bytes, int | None] | None, slab_fd: int | None = None) -> None:
        """Send a message to the worker: (index, wants_ack, pickled request, its slab's size or None); a slab's file
        descriptor follows it on the same pipe (SCM_RIGHTS), so the trainer starts no listener thread (as
        multiprocessing's resource sharer does, with a socket in a /tmp/pymp-* directory)."""
        assert self._conn is not None  # only called with a worker (_ensure_worker ran)
        assert self._process is not None
        with contextlib.suppress(OSError):  # the worker is dead; _poll reports its in-flight requests as failed
            self._conn.send(message)
            if slab_fd is not None:
                send_handle(self._conn, slab_fd, self._process.pid)

    def _wait_for_preload(self, idx: int) -> None:
        while idx in self._in_flight and idx not in self._preloaded:
            self._poll(_POLL_S)
        self._preloaded.discard(idx)

    def _poll(self, timeout: float) -> None:
        if self._process is None:
            return
        assert self._conn is not None  # set together with _process
        connection.wait([self._conn, self._process.sentinel], timeout)
        alive = self._process.is_alive()  # read before draining: a dead worker's messages are in
        self._drain()
        if not alive:
            self._fail_in_flight(f"worker exited with code {self._process.exitcode}")

    def _drain(self) -> None:
        assert self._conn is not None  # only called by _poll, with a worker
        try:
            while self._conn.poll():
                kind, idx, err = self._conn.recv()
                if kind == "preloaded":
                    self._preloaded.add(idx)
                else:
                    self._complete(idx, err)
        except (EOFError, OSError):
            pass  # the worker closed its end or died; _poll sees it exit

    def _complete(self, idx: int, err: BaseException | None) -> None:
        self._results[idx] = err
        self._pool.give(self._in_flight.pop(idx, None))

    def _fail_in_flight(self, message: str) -> None:
        for idx in list(self._in_flight):
            self._complete(idx, RuntimeError(message))
