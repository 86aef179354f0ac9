"""Run a checkpoint function in the background and finalize it on all ranks together.

Contract (signature-compatible with NVRx ``async_ckpt.core``):

* ``AsyncRequest``: ``async_fn(*async_fn_args, **async_fn_kwargs)`` runs in the background;
  if ``preload_fn`` is set it takes no arguments and its result replaces positional argument 1.
  ``finalize_fns`` run in the trainer, in order, once the call is done on every rank.
* ``AsyncCallsQueue`` hands requests to a caller and finalizes them in schedule order
  (head-of-line). Its methods must be called by all ranks in the same order. The "world" is
  ``torch.distributed`` when initialized, else this process alone (no collectives at all).

Decisions:

* Completion check: exactly one all-reduce (SUM) of one int32 per check, packing
  ``alive + failed * (world_size + 1)`` so every rank learns both "some rank still running" and
  "some rank failed". Errors are gathered (``all_gather_object``) only on failure.
* A failure (exception in async_fn / preload_fn / a finalize fn, or a worker that dies) raises
  ``CheckpointException`` on every rank, ``failures`` mapping each failing rank to its exception.
  The failed request is dropped: it is never retried and its finalize fns do not run (after a
  failing finalize fn, the remaining ones are skipped). Later requests stay queued.
* Snapshot: ``PersistentAsyncCaller`` copies every tensor reachable through dicts, lists and
  tuples of the args/kwargs into one shared-memory segment per request (a Linux memfd) before
  scheduling returns: one copy, tied tensors stay tied, segments come from a pool keyed by byte
  size and are reused once the request completes. The worker maps the segment and sees each
  tensor with its own storage (so ``torch.save`` writes what it would have written for the
  originals); only one file descriptor crosses per request, whatever the number of tensors.
  ``TemporalAsyncCaller`` forks, so CPU tensors are copy-on-write; GPU tensors go to host first.
* ``PersistentAsyncCaller``: one spawned, non-daemonic worker (own process group) serving
  requests FIFO over a Pipe. Requests are pickled in the trainer, so an unpicklable request
  raises TypeError at schedule time. A watchdog exits the worker when the trainer dies, an exit
  hook aborts workers still running when the trainer exits, and a worker found dead is
  restarted by the next schedule.
"""

import logging
import mmap
import os
import pickle
import queue
import signal
import sys
import threading
import traceback
import weakref
from abc import ABC, abstractmethod
from collections import defaultdict, deque
from dataclasses import dataclass
from multiprocessing import connection, get_context
from multiprocessing import util as mp_util
from multiprocessing.reduction import DupFd, ForkingPickler
from typing import Any, Callable, Deque, Dict, List, NamedTuple, Optional, Tuple

import torch
import torch.distributed as dist
import torch.multiprocessing  # noqa: F401  (registers torch's tensor reductions with ForkingPickler)
from torch.distributed.checkpoint import CheckpointException

from ..utils import dist_rank, dist_ready, picklable_error, tree_map

__all__ = [
    "AsyncRequest",
    "AsyncCaller",
    "TemporalAsyncCaller",
    "PersistentAsyncCaller",
    "AsyncCallsQueue",
]

logger = logging.getLogger(__name__)

_POLL_S = 0.1  # blocking waits wake up this often to recheck worker liveness
_ABORT_GRACE_S = 5.0  # SIGTERM -> SIGKILL delay when aborting a worker
_ALIGN = 64  # byte alignment of each staged tensor inside a slab


class AsyncRequest(NamedTuple):
    """One background call plus the functions that finalize it on every rank."""

    async_fn: Optional[Callable]
    async_fn_args: Tuple
    finalize_fns: List[Callable]
    async_fn_kwargs: Optional[Dict] = None
    preload_fn: Optional[Callable] = None
    is_frozen: bool = False
    call_idx: int = 0

    def add_finalize_fn(self, fn: Callable) -> None:
        """Append ``fn`` to the finalize functions (not allowed once frozen)."""
        if self.is_frozen:
            raise RuntimeError("cannot add a finalize function to a frozen AsyncRequest")
        if not callable(fn):
            raise TypeError(f"finalize function must be callable, got {type(fn).__name__}")
        self.finalize_fns.append(fn)

    def freeze(self) -> "AsyncRequest":
        """Return a frozen copy whose finalize functions no longer follow this request's list."""
        return self._replace(is_frozen=True, finalize_fns=tuple(self.finalize_fns))

    def execute_sync(self) -> None:
        """Do in this process what the async path does: preload, call, barrier, finalize."""
        args = list(self.async_fn_args)
        if self.preload_fn is not None:
            args[1] = self.preload_fn()
        if self.async_fn is not None:
            self.async_fn(*args, **(self.async_fn_kwargs or {}))
        if dist_ready():
            dist.barrier()
        for fn in self.finalize_fns:
            fn()


# ---------------------------------------------------------------------------------------------
# Collectives and failure reporting


def _collective_device() -> torch.device:
    """Device for collective tensors: the current GPU under NCCL, CPU otherwise (gloo)."""
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _all_reduce(values: List[int], op, dtype: torch.dtype) -> List[int]:
    tensor = torch.tensor(values, dtype=dtype, device=_collective_device())
    dist.all_reduce(tensor, op=op)
    return tensor.tolist()


class _CheckpointFailure(CheckpointException):
    """CheckpointException with plain exceptions as ``failures`` values, and a matching str()."""

    def __str__(self) -> str:
        lines = [f"{self.args[0]} failed on rank(s) {sorted(self.failures)}"]
        for rank, exc in sorted(self.failures.items()):
            text = "".join(traceback.format_exception_only(exc)).rstrip()
            lines.append(f"[rank {rank}] {text}")
        return "\n".join(lines)


def _raise_failure(what: str, local_err: Optional[BaseException], collective: bool) -> None:
    """Raise CheckpointException with every failing rank's error (gathered if ``collective``)."""
    if collective:
        errors: List[Optional[BaseException]] = [None] * dist.get_world_size()
        dist.all_gather_object(errors, local_err)
        failures = {rank: err for rank, err in enumerate(errors) if err is not None}
    else:
        failures = {dist_rank(): local_err}
    raise _CheckpointFailure(what, failures) from local_err


def _run_guarded(fn: Callable, *args, **kwargs) -> Tuple[Any, Optional[BaseException]]:
    """Call ``fn``; return ``(result, None)`` or ``(None, picklable error)``."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:
        err = picklable_error(exc)
        if err is exc:
            tb_text = "".join(traceback.format_tb(exc.__traceback__.tb_next))
            exc.add_note(f"Traceback in process {os.getpid()}:\n{tb_text}")
        # Drop the frames (and the tensors they reference) now; tracebacks do not pickle anyway.
        return None, err.with_traceback(None)


# ---------------------------------------------------------------------------------------------
# Process helpers


def _start_lifeline_watchdog(lifeline: connection.Connection) -> None:
    """Kill this process group once the trainer holding the lifeline's write end is gone."""

    def watch() -> None:
        try:
            lifeline.recv()  # the trainer never writes: this only ends with EOF
        except (EOFError, OSError):
            pass
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="ckpt-lifeline", daemon=True).start()


def _signal_group(process, sig: int) -> None:
    """Signal the process group led by ``process``, or the process alone if there is none yet."""
    try:
        os.killpg(process.pid, sig)
    except ProcessLookupError:
        # No group: the child has not called setpgid yet, or the whole group is gone.
        # Only signal the pid while it is unreaped, so it cannot belong to someone else.
        if process.exitcode is None:
            try:
                os.kill(process.pid, sig)
            except ProcessLookupError:
                pass


def _kill_group(process) -> None:
    """SIGTERM the process and its group, wait up to the grace period, then SIGKILL. Bounded."""
    _signal_group(process, signal.SIGTERM)
    process.join(_ABORT_GRACE_S)
    _signal_group(process, signal.SIGKILL)
    process.join()


def _tensor_key(t: torch.Tensor) -> Tuple:
    """Identity of a tensor view: equal keys mean the same bytes seen the same way."""
    if t.layout != torch.strided:
        return ("object", id(t))
    storage_ptr = t.untyped_storage().data_ptr()
    return (t.device, storage_ptr, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)


def _map_tensors(fn: Callable[[torch.Tensor], Any], obj: Any) -> Any:
    """``tree_map`` over tensors, calling ``fn`` once per distinct view (tied tensors stay tied)."""
    memo: Dict[Tuple, Any] = {}

    def visit(x: Any) -> Any:
        if not isinstance(x, torch.Tensor):
            return x
        key = _tensor_key(x)
        if key not in memo:
            memo[key] = fn(x)
        return memo[key]

    return tree_map(visit, obj)


# Callers with a live worker or child, aborted when this process exits. multiprocessing's exit
# function joins non-daemonic children, which would wait forever on an idle persistent worker.
# It runs exit finalizers (exitpriority >= 0) before that join, both at interpreter exit and at
# the end of processes started by multiprocessing (e.g. torch.multiprocessing.spawn ranks),
# where plain atexit hooks would come too late or never run. Processes started by multiprocessing
# clear the finalizer registry they inherit, and a forked child must never abort its parent's
# workers: so the set and its hook belong to one pid and are made afresh in each process.
_LIVE_CALLERS: "weakref.WeakSet[AsyncCaller]" = weakref.WeakSet()
_LIVE_CALLERS_PID: Optional[int] = None


def _track_live(caller: "AsyncCaller") -> None:
    global _LIVE_CALLERS, _LIVE_CALLERS_PID
    if _LIVE_CALLERS_PID != os.getpid():
        _LIVE_CALLERS, _LIVE_CALLERS_PID = weakref.WeakSet(), os.getpid()
        mp_util.Finalize(None, _abort_live_callers, exitpriority=10)
    _LIVE_CALLERS.add(caller)


def _abort_live_callers() -> None:
    if _LIVE_CALLERS_PID == os.getpid():
        for caller in list(_LIVE_CALLERS):
            caller.close(abort=True)


# ---------------------------------------------------------------------------------------------
# Callers


class AsyncCaller(ABC):
    """Runs scheduled requests in the background and tells when the oldest one is done.

    Subclasses keep ``_pending`` (indices scheduled, not yet reported done, oldest first) and
    fill ``_results`` (index -> error or None) from ``_poll`` as requests finish locally.
    """

    def __init__(self):
        self._pending: Deque[int] = deque()
        self._results: Dict[int, Optional[BaseException]] = {}

    @abstractmethod
    def schedule_async_call(self, async_req: AsyncRequest) -> None:
        """Start ``async_req`` in the background. Called on all ranks."""

    @abstractmethod
    def is_current_async_call_done(self, blocking: bool = False, no_dist: bool = False) -> bool:
        """Whether the oldest unreported request is done on all ranks (this rank if no_dist).

        Raises CheckpointException (on all ranks) if it is done everywhere and failed anywhere.
        """

    def sync_all_async_calls(self, is_alive: int) -> bool:
        """True iff no rank reports ``is_alive`` (one all-reduce SUM of one int)."""
        if not dist_ready():
            return not is_alive
        return _all_reduce([int(is_alive)], dist.ReduceOp.SUM, torch.int32)[0] == 0

    @abstractmethod
    def close(self, abort: bool = False) -> None:
        """Stop the background process(es): wait for them, or kill them if ``abort``."""

    def __del__(self):
        # Never a collective here: a caller collected while still running is simply aborted.
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
        err = self._results.get(head)
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
            _raise_failure("async checkpoint call", err, collective)
        return True

    @staticmethod
    def _sync_done_failed(done: bool, failed: bool) -> Tuple[bool, bool]:
        """Global (all done, any failed) from one all-reduce of ``alive + failed*(world+1)``."""
        base = dist.get_world_size() + 1
        packed = int(not done) + int(failed) * base
        total = _all_reduce([packed], dist.ReduceOp.SUM, torch.int32)[0]
        return total % base == 0, total >= base


class TemporalAsyncCaller(AsyncCaller):
    """Deprecated: forks one child per request (CPU tensors shared copy-on-write).

    preload_fn runs in the trainer and GPU tensors are copied to host before forking, since
    the child cannot use CUDA. The child reports its error over a pipe and exits non-zero.
    """

    def __init__(self):
        super().__init__()
        # index -> (child process, result pipe read end, lifeline write end)
        self._children: Dict[int, Tuple[Any, connection.Connection, connection.Connection]] = {}

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
        for process, result_conn, lifeline in self._children.values():
            if abort:
                _kill_group(process)
            else:
                process.join()
            result_conn.close()
            lifeline.close()
        self._children.clear()
        self._pending.clear()
        self._results.clear()
        _LIVE_CALLERS.discard(self)

    @staticmethod
    def _prepare(async_req: AsyncRequest) -> Tuple[List, Dict, Optional[BaseException]]:
        """Run preload_fn here and copy GPU tensors to host; return (args, kwargs, error)."""
        args = list(async_req.async_fn_args)
        if async_req.preload_fn is not None:
            args[1], err = _run_guarded(async_req.preload_fn)
            if err is not None:
                return [], {}, err
        kwargs = dict(async_req.async_fn_kwargs or {})
        args, kwargs = _map_tensors(_gpu_to_host, (args, kwargs))
        return args, kwargs, None

    def _fork(self, idx: int, async_fn: Callable, args: List, kwargs: Dict) -> None:
        ctx = get_context("fork")
        result_r, result_w = ctx.Pipe(duplex=False)
        lifeline_r, lifeline_w = ctx.Pipe(duplex=False)
        process = ctx.Process(
            target=_temporal_child,
            args=(async_fn, args, kwargs, result_w, lifeline_r, lifeline_w),
            name=f"ckpt-temporal-{idx}",
            daemon=False,  # async_fn may start processes of its own
        )
        process.start()
        result_w.close()
        lifeline_r.close()
        self._children[idx] = (process, result_r, lifeline_w)
        _track_live(self)

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
                return
            except EOFError:
                pass
        if not alive:
            self._results[idx] = RuntimeError(f"worker exited with code {process.exitcode}")


def _gpu_to_host(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu") if t.is_cuda else t


def _temporal_child(async_fn, args, kwargs, result_conn, lifeline, lifeline_w) -> None:
    """Body of a forked child: run the call, report the error (or None), exit 1 on failure."""
    lifeline_w.close()  # inherited by fork; only the trainer may hold it, or EOF never comes
    os.setpgid(0, 0)
    _start_lifeline_watchdog(lifeline)
    _, err = _run_guarded(async_fn, *args, **kwargs)
    result_conn.send(err)
    if err is not None:
        sys.exit(1)


@dataclass(frozen=True)
class _Staged:
    """Placeholder sent instead of a staged tensor: where its bytes are in the request's slab.

    Not a tuple, so that tree_map treats it as a leaf.
    """

    offset: int
    numel: int
    dtype: torch.dtype
    shape: Tuple[int, ...]


class _Slab:
    """One shared-memory segment (a Linux memfd) mapped in the trainer as a uint8 tensor."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self.fd = os.memfd_create("ckpt-staging", os.MFD_CLOEXEC)
        os.ftruncate(self.fd, nbytes)
        self.data = torch.frombuffer(mmap.mmap(self.fd, nbytes), dtype=torch.uint8)
        self.pinned = False

    def write(self, place: _Staged, t: torch.Tensor) -> None:
        size = place.numel * t.element_size()
        dst = self.data[place.offset : place.offset + size].view(t.dtype).view(t.shape)
        dst.copy_(t.detach())  # detach: copying from a grad-requiring tensor would record it

    def pin(self) -> None:
        # UNTESTED ON GPU (written on a CPU-only machine): page-lock the segment once so
        # device-to-host copies into it run at pinned-memory speed.
        if not self.pinned:
            torch.cuda.cudart().cudaHostRegister(self.data.data_ptr(), self.nbytes, 0)
            self.pinned = True

    def close(self) -> None:
        if self.pinned:  # UNTESTED ON GPU, see pin()
            torch.cuda.cudart().cudaHostUnregister(self.data.data_ptr())
        os.close(self.fd)  # the mapping itself goes when self.data is collected


class _SlabPool:
    """Slabs keyed by byte size; a slab returns here when its request completes."""

    def __init__(self):
        self._free: Dict[int, List[_Slab]] = defaultdict(list)

    def take(self, nbytes: int) -> _Slab:
        free = self._free[nbytes]
        return free.pop() if free else _Slab(nbytes)

    def give(self, slab: Optional[_Slab]) -> None:
        if slab is not None:
            self._free[slab.nbytes].append(slab)

    def clear(self) -> None:
        for slabs in self._free.values():
            for slab in slabs:
                slab.close()
        self._free.clear()


def _stage_layout(obj: Any) -> Tuple[Any, List[Tuple[torch.Tensor, _Staged]], int]:
    """Replace tensors in ``obj`` by slab placeholders; return (obj, [(tensor, place)], size)."""
    layout: List[Tuple[torch.Tensor, _Staged]] = []
    size = 0

    def place(t: torch.Tensor) -> Any:
        nonlocal size
        if t.layout != torch.strided or t.is_quantized or t.numel() == 0:
            return t.detach().clone()  # rare or empty: a private copy, pickled by torch
        staged = _Staged(size, t.numel(), t.dtype, tuple(t.shape))
        layout.append((t, staged))
        nbytes = t.numel() * t.element_size()
        size += -(-nbytes // _ALIGN) * _ALIGN
        return staged

    return _map_tensors(place, obj), layout, size


_WORKER_SLAB_MAPS: Dict[Tuple[int, int, int], mmap.mmap] = {}


def _map_slab(fd: int, nbytes: int) -> mmap.mmap:
    """Worker side: the mapping of the slab behind ``fd``, made once per slab.

    A fresh mapping would fault every page again inside the writer's ``write()`` calls (about 0.3 s per
    GiB, measured). Keeping it costs no memory: the pages are the slab's, which the trainer's pool keeps
    for the caller's lifetime anyway, and a mapped memfd keeps its inode, so the key is never reused.
    """
    st = os.fstat(fd)
    key = (st.st_dev, st.st_ino, nbytes)
    if key not in _WORKER_SLAB_MAPS:
        _WORKER_SLAB_MAPS[key] = mmap.mmap(fd, nbytes)
    return _WORKER_SLAB_MAPS[key]


def _unstage(request: AsyncRequest, slab_ref: Optional[Tuple[Any, int]]) -> AsyncRequest:
    """Worker side: map the request's slab and turn placeholders back into tensors.

    Each tensor gets its own storage over the shared pages (no copy), so torch.save writes
    exactly what it would for the trainer's tensors. Equal placeholders give the same tensor.
    """
    if slab_ref is None:
        return request
    dup_fd, nbytes = slab_ref
    fd = dup_fd.detach()
    try:
        pages = _map_slab(fd, nbytes)
    finally:
        os.close(fd)
    tensors: Dict[int, torch.Tensor] = {}

    def rebuild(x: Any) -> Any:
        if not isinstance(x, _Staged):
            return x
        if x.offset not in tensors:
            flat = torch.frombuffer(pages, dtype=x.dtype, count=x.numel, offset=x.offset)
            tensors[x.offset] = flat.view(x.shape)
        return tensors[x.offset]

    args, kwargs = tree_map(rebuild, (request.async_fn_args, request.async_fn_kwargs or {}))
    return request._replace(async_fn_args=args, async_fn_kwargs=kwargs)


class PersistentAsyncCaller(AsyncCaller):
    """One long-lived spawned worker per caller, serving requests FIFO, one at a time.

    Tensors in the request's args/kwargs are staged into a pooled shared-memory slab in the
    trainer; the worker maps the slab and uses the tensors without another copy. With a
    preload_fn, scheduling waits for the worker's "preloaded" acknowledgement (or its death).
    """

    def __init__(self):
        super().__init__()
        self._process = None
        self._conn: Optional[connection.Connection] = None
        self._lifeline: Optional[connection.Connection] = None  # write end, held only here
        self._pool = _SlabPool()
        self._in_flight: Dict[int, Optional[_Slab]] = {}  # sent, not done -> its slab
        self._preloaded: set = set()

    def schedule_async_call(self, async_req: AsyncRequest) -> None:
        idx = async_req.call_idx
        if async_req.async_fn is None:
            self._results[idx] = None
            self._pending.append(idx)
            return
        request, slab = self._stage(async_req)
        slab_ref = None if slab is None else (DupFd(slab.fd), slab.nbytes)
        try:
            body = bytes(ForkingPickler.dumps((request, slab_ref)))
        except Exception as exc:
            self._pool.give(slab)
            raise TypeError(f"AsyncRequest cannot be sent to the checkpoint worker: {exc}") from exc
        self._ensure_worker()
        self._pending.append(idx)
        self._in_flight[idx] = slab
        wants_ack = request.preload_fn is not None
        self._send((idx, wants_ack, body))
        if wants_ack:
            self._wait_for_preload(idx)

    def is_current_async_call_done(self, blocking: bool = False, no_dist: bool = False) -> bool:
        return self._check_done(blocking, no_dist)

    def close(self, abort: bool = False) -> None:
        if self._process is not None:
            if abort:
                _kill_group(self._process)
            else:
                self._shutdown_worker()
            self._release_worker()
        for slab in self._in_flight.values():
            self._pool.give(slab)
        self._in_flight.clear()
        self._pool.clear()
        self._pending.clear()
        self._results.clear()
        _LIVE_CALLERS.discard(self)

    def _stage(self, req: AsyncRequest) -> Tuple[AsyncRequest, Optional[_Slab]]:
        """Copy the request's tensors into a pooled slab; return the request to send and slab."""
        args = list(req.async_fn_args)
        if req.preload_fn is not None:
            args[1] = None  # replaced by preload_fn() in the worker
        kwargs = dict(req.async_fn_kwargs or {})
        (args, kwargs), layout, size = _stage_layout((tuple(args), kwargs))
        slab = self._pool.take(size) if size else None
        if any(t.is_cuda for t, _ in layout):
            slab.pin()
        for t, place in layout:
            slab.write(place, t)
        return req._replace(async_fn_args=args, async_fn_kwargs=kwargs), slab

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
            target=_persistent_worker,
            args=(worker_conn, lifeline_r, logger.getEffectiveLevel()),
            name="ckpt-worker",
            daemon=False,  # async_fn may start processes of its own
        )
        process.start()
        worker_conn.close()
        lifeline_r.close()
        self._process, self._conn, self._lifeline = process, conn, lifeline_w
        _track_live(self)
        logger.info("Started persistent checkpoint worker (pid %d)", self._process.pid)

    def _release_worker(self) -> None:
        """Close our ends of the pipes once the worker has exited (or been killed)."""
        self._conn.close()
        self._lifeline.close()
        self._process = self._conn = self._lifeline = None

    def _shutdown_worker(self) -> None:
        self._send(None)
        while self._process.is_alive():
            self._poll(_POLL_S)  # keep reading, so the worker never blocks on a full pipe
        self._process.join()

    def _send(self, message) -> None:
        try:
            self._conn.send(message)
        except OSError:
            pass  # the worker is dead; _poll reports its in-flight requests as failed

    def _wait_for_preload(self, idx: int) -> None:
        while idx in self._in_flight and idx not in self._preloaded:
            self._poll(_POLL_S)
        self._preloaded.discard(idx)

    def _poll(self, timeout: float) -> None:
        if self._process is None:
            return
        connection.wait([self._conn, self._process.sentinel], timeout)
        alive = self._process.is_alive()  # read before draining: a dead worker's messages are in
        self._drain()
        if not alive:
            self._fail_in_flight(f"worker exited with code {self._process.exitcode}")

    def _drain(self) -> None:
        try:
            while self._conn.poll():
                kind, idx, err = self._conn.recv()
                if kind == "preloaded":
                    self._preloaded.add(idx)
                else:
                    self._complete(idx, err)
        except (EOFError, OSError):
            pass  # the worker closed its end or died; _poll sees it exit

    def _complete(self, idx: int, err: Optional[BaseException]) -> None:
        self._results[idx] = err
        self._pool.give(self._in_flight.pop(idx, None))

    def _fail_in_flight(self, message: str) -> None:
        for idx in list(self._in_flight):
            self._complete(idx, RuntimeError(message))


def _persistent_worker(conn, lifeline, log_level: int) -> None:
    """Worker main loop: serve requests in order until told to stop (``None``) or orphaned."""
    os.setpgid(0, 0)  # lets the trainer's abort reach the processes async_fn starts
    _start_lifeline_watchdog(lifeline)
    logger.setLevel(log_level)
    inbox: "queue.Queue" = queue.Queue()
    threading.Thread(target=_receive_requests, args=(conn, inbox), daemon=True).start()
    while True:
        item = inbox.get()
        if item is None:
            break
        _serve_request(conn, *item)
        item = None  # release the request (and its shared pages) while waiting for the next
    logger.debug("Persistent checkpoint worker %d exiting", os.getpid())


def _receive_requests(conn, inbox: "queue.Queue") -> None:
    """Read and unpickle requests as they arrive, so the trainer never waits on a busy worker.

    Holds no request between iterations: tensors freed by this daemon thread while the
    interpreter shuts down would abort the worker.
    """
    while (message := _recv_or_none(conn)) is not None:
        inbox.put(_decode_request(*message))
    inbox.put(None)


def _recv_or_none(conn):
    try:
        return conn.recv()
    except (EOFError, OSError):  # the trainer is gone
        return None


def _decode_request(idx: int, wants_ack: bool, body: bytes) -> Tuple:
    request, err = _run_guarded(lambda: _unstage(*pickle.loads(body)))
    return idx, wants_ack, request, err


def _serve_request(conn, idx: int, wants_ack: bool, request, err) -> None:
    args = list(request.async_fn_args) if err is None else []
    if err is None and request.preload_fn is not None:
        args[1], err = _run_guarded(request.preload_fn)
    if wants_ack:
        conn.send(("preloaded", idx, err))
    if err is None:
        _, err = _run_guarded(request.async_fn, *args, **(request.async_fn_kwargs or {}))
    conn.send(("done", idx, err))
    logger.debug("Checkpoint call %d finished (error: %r)", idx, err)


# ---------------------------------------------------------------------------------------------
# Queue


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

    Indices are consecutive from 0 and only consumed by successful schedules. Persistent
    queues share one PersistentAsyncCaller; temporal queues use one caller per request.
    """

    def __init__(self, persistent: bool = True):
        self.persistent = persistent
        self._pending: Deque[_ActiveAsyncRequest] = deque()
        self._next_idx = 0
        self._persistent_caller: Optional[PersistentAsyncCaller] = None
        self._warned_temporal = False
        self._closed = False

    def schedule_async_request(self, async_request: AsyncRequest) -> int:
        """Start ``async_request`` in the background; return its queue index. On all ranks."""
        request = _as_async_request(async_request)
        if self._closed:
            raise RuntimeError("AsyncCallsQueue is closed")
        idx = self._next_idx
        frozen = request.freeze()._replace(call_idx=idx)
        caller = self._get_async_caller()
        caller.schedule_async_call(frozen._replace(finalize_fns=()))
        self._pending.append(_ActiveAsyncRequest(idx, caller, frozen))
        self._next_idx += 1
        return idx

    def maybe_finalize_async_calls(self, blocking: bool = False, no_dist: bool = False) -> List[int]:
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

    def __del__(self):
        if getattr(self, "_closed", True):
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
            self._persistent_caller = PersistentAsyncCaller()
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
            top, neg_bottom, failed = _all_reduce(values, dist.ReduceOp.MAX, torch.int64)
            if (top, -neg_bottom) != (entry.idx, entry.idx):
                raise RuntimeError(
                    f"ranks finalized different calls: this rank finalized {entry.idx}, "
                    f"others range from {-neg_bottom} to {top}"
                )
        if failed:
            _raise_failure("async checkpoint finalization", err, collective)

    def _finalize_all(self) -> Optional[BaseException]:
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
        callers = {id(entry.async_caller): entry.async_caller for entry in self._pending}
        if self._persistent_caller is not None:
            callers[id(self._persistent_caller)] = self._persistent_caller
        self._pending.clear()
        for caller in callers.values():
            caller.close(abort=True)
