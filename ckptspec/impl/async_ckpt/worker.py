"""The bodies of the background processes: the persistent worker loop and the temporal child.

Contract:

* ``persistent_worker`` serves requests in the order they arrive over its pipe, one at a time,
  until it receives ``None`` or the trainer is gone. A request arrives as ``(idx, wants_ack,
  body)`` with ``body`` the pickled ``(request, slab_ref)``. For each it sends
  ``("preloaded", idx, err)`` once ``preload_fn`` ran (only if ``wants_ack``), then
  ``("done", idx, err)``; ``err`` is None or the picklable error that stopped the call.
* ``temporal_child`` runs one call in a forked child: it sends ``STARTED`` as soon as it runs, then
  its error (or None), and exits non-zero on failure.
* Both lead their own process group (so an abort reaches the processes ``async_fn`` starts) and
  kill that group once the trainer holding the lifeline's write end is gone.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import queue
import signal
import sys
import threading
from collections.abc import Callable, Sequence
from multiprocessing import connection
from multiprocessing.reduction import recv_handle
from typing import Any

import torch.multiprocessing  # noqa: F401  (torch's tensor reductions, for what the worker sends back)

from ..utils import paused_gc
from .request import AsyncRequest, run_guarded
from .staging import unstage, wait_all_landed

__all__ = ["STARTED", "persistent_worker", "temporal_child"]

STARTED = "started"
"""A temporal child's first message: it is past the fork and runs (the trainer waits for it, bounded)."""

logger = logging.getLogger(__name__)

_Request = tuple[int, bool, AsyncRequest | None, BaseException | None]
"""A decoded request: (index, whether the trainer waits for the preload's ack, the request, its decoding error)."""


def _start_lifeline_watchdog(lifeline: connection.Connection) -> None:
    """Kill this process group once the trainer holding the lifeline's write end is gone."""

    def watch() -> None:
        with contextlib.suppress(EOFError, OSError):
            lifeline.recv()  # the trainer never writes: this only ends with EOF
        os.killpg(os.getpgid(0), signal.SIGKILL)

    threading.Thread(target=watch, name="ckpt-lifeline", daemon=True).start()


def temporal_child(
    async_fn: Callable[..., object],
    args: Sequence[Any],
    kwargs: dict[str, Any],
    result_conn: connection.Connection,
    lifeline: connection.Connection,
    lifeline_w: connection.Connection,
) -> None:
    """Body of a forked child: say it started, run the call, report the error (or None), exit 1 on failure."""
    result_conn.send(STARTED)
    lifeline_w.close()  # inherited by fork; only the trainer may hold it, or EOF never comes
    os.setpgid(0, 0)
    _start_lifeline_watchdog(lifeline)
    _, err = run_guarded(async_fn, *args, **kwargs)
    result_conn.send(err)
    if err is not None:
        sys.exit(1)


def persistent_worker(conn: connection.Connection, lifeline: connection.Connection, log_level: int) -> None:
    """Worker main loop: serve requests in order until told to stop (``None``) or orphaned."""
    os.setpgid(0, 0)
    _start_lifeline_watchdog(lifeline)
    logger.setLevel(log_level)
    inbox: queue.Queue[_Request | None] = queue.Queue()
    threading.Thread(target=_receive_requests, args=(conn, inbox), daemon=True).start()
    while True:
        item = inbox.get()
        if item is None:
            break
        _serve_request(conn, *item)
        item = None  # release the request (and its shared pages) while waiting for the next
    logger.debug("Persistent checkpoint worker %d exiting", os.getpid())


def _receive_requests(conn: connection.Connection, inbox: queue.Queue[_Request | None]) -> None:
    """Read and unpickle requests as they arrive, so the trainer never waits on a busy worker.

    Holds no request between iterations: tensors freed by this daemon thread while the
    interpreter shuts down would abort the worker.
    """
    while (message := _recv_or_none(conn)) is not None:
        inbox.put(_decode_request(conn, *message))
    inbox.put(None)


def _recv_or_none(conn: connection.Connection) -> Any:
    try:
        return conn.recv()
    except (EOFError, OSError):  # the trainer is gone
        return None


@paused_gc()
def _decode_request(
    conn: connection.Connection, idx: int, wants_ack: bool, body: bytes, slab_size: int | None
) -> _Request:
    """Unpickle a request and map its slab, whose file descriptor follows the message on the pipe when `slab_size`
    is set (read first, whatever the unpickling does, so the stream stays in step)."""
    fd = None
    if slab_size is not None:
        try:
            fd = recv_handle(conn)
        except (EOFError, OSError) as exc:  # the trainer is gone mid-message
            return idx, wants_ack, None, exc
    try:
        request, err = run_guarded(pickle.loads, body)
        if err is None:
            slab_ref, fd = (None if fd is None else (fd, slab_size)), None  # unstage owns (and closes) it now
            request, err = run_guarded(unstage, request, slab_ref)
        return idx, wants_ack, request, err
    finally:
        if fd is not None:
            os.close(fd)


@paused_gc()
def _serve_request(
    conn: connection.Connection, idx: int, wants_ack: bool, request: AsyncRequest | None, err: BaseException | None
) -> None:
    args = list(request.async_fn_args) if request is not None else []  # None: not decoded (err says why)
    if request is not None and request.preload_fn is not None:
        args[1], err = run_guarded(request.preload_fn)
    if wants_ack:
        conn.send(("preloaded", idx, err))
    if request is not None and err is None:
        assert request.async_fn is not None  # the caller sends only requests with a call
        _, err = run_guarded(wait_all_landed, request.async_fn, (args, request.async_fn_kwargs))
    if request is not None and err is None:
        assert request.async_fn is not None
        _, err = run_guarded(request.async_fn, *args, **(request.async_fn_kwargs or {}))
    conn.send(("done", idx, err))
    logger.debug("Checkpoint call %d finished (error: %r)", idx, err)
