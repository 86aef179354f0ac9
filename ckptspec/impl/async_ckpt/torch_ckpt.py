"""Asynchronous ``torch.save`` on top of ``AsyncCallsQueue``.

``TorchAsyncCheckpoint.async_save(state_dict, f, ...)`` takes ``torch.save``'s arguments and
returns the queue index of the scheduled save. The snapshot is taken by the caller's staging
(see ``staging``) before ``async_save`` returns, so the trainer may modify tensors right away.
``f`` should be a path: the save runs in another process, so a file object would be written
there, not here.

``save`` is ``torch.save`` itself (an instance attribute, as in NVRx), for a synchronous save.

Decisions: ``async_fn`` is ``torch.save`` and is set per instance (instances never share it);
``finalize_async_save`` checks locally by default (``no_dist=True``), as in NVRx.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from ..utils import dist_rank
from .core import AsyncCallsQueue, AsyncRequest

__all__ = ["TorchAsyncCheckpoint"]

logger = logging.getLogger(__name__)


class TorchAsyncCheckpoint:
    """``torch.save`` in the background, finalized through an ``AsyncCallsQueue``."""

    def __init__(self, persistent_queue: bool = True):
        self.save = torch.save  # NVRx's instance attribute: the synchronous save
        self.async_fn = torch.save
        self._async_calls_queue = AsyncCallsQueue(persistent=persistent_queue)

    def async_save(self, state_dict: object, *args: Any, **kwargs: Any) -> int:
        """Schedule ``torch.save(state_dict, *args, **kwargs)``; return its queue index."""
        request = AsyncRequest(self.async_fn, (state_dict, *args), [], kwargs)
        return self._async_calls_queue.schedule_async_request(request)

    def finalize_async_save(self, blocking: bool = False, no_dist: bool = True, terminate: bool = False) -> list[int]:
        """Finalize finished saves (all of them if ``blocking``); close the queue if ``terminate``."""
        if blocking and self._async_calls_queue.get_num_unfinalized_calls() > 0 and dist_rank() == 0:
            logger.info("Waiting for unfinalized async checkpoint saves to finish")
        finalized = self._async_calls_queue.maybe_finalize_async_calls(blocking, no_dist)
        if terminate:
            self._async_calls_queue.close()
        return finalized

    def close(self, abort: bool = False) -> None:
        """Finalize (or with ``abort``, kill and drop) pending saves and stop the worker."""
        self._async_calls_queue.close(abort=abort)
