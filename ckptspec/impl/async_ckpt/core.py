"""Run a checkpoint function in the background and finalize it on all ranks together.

The documented module path (signature-compatible with NVRx ``async_ckpt.core``); the code lives in:

* ``request``: ``AsyncRequest`` and how a failure is reported (``CheckpointException`` on every
  rank, ``failures`` mapping each failing rank to its exception);
* ``callers``: ``AsyncCaller``, ``TemporalAsyncCaller``, ``PersistentAsyncCaller`` (one all-reduce
  of one int32 per completion check);
* ``staging``: the shared-memory snapshot of a request's tensors taken before scheduling returns;
* ``worker``: the loops of the background processes;
* ``calls_queue``: ``AsyncCallsQueue``, which finalizes requests in schedule order, and
  ``abort_nvrx_checkpoint()``, which aborts every open queue of the process.
"""

from __future__ import annotations

import logging

from .callers import AsyncCaller, PersistentAsyncCaller, TemporalAsyncCaller
from .calls_queue import AsyncCallsQueue, abort_nvrx_checkpoint
from .request import AsyncRequest

__all__ = [
    "AsyncCaller",
    "AsyncCallsQueue",
    "AsyncRequest",
    "PersistentAsyncCaller",
    "TemporalAsyncCaller",
    "abort_nvrx_checkpoint",
]

logger = logging.getLogger(__name__)
