"""The DefaultStager a DCP staged peer saves with: one kept across saves where the torch release allows it.

torch 2.11 closes the stager a caller passes to `dcp.async_save` once the save's upload completes (torch issue
183413): a closed DefaultStager has emptied its copy table, and the next save with it raises
`KeyError: <class 'type'>` (seen on the H100 run of 2026-11-27). torch 2.13 closes only a stager it made itself,
and documents that a caller who passes one closes it after the last save.

`KeptStager` gives `async_save` a thin stager that forwards every call to the DefaultStager and records a `close()`
that comes from torch. From then on each save gets a fresh DefaultStager (a fresh one pins new host memory on
every save: the honest cost of that release), and `note` says so, for the benchmark's row. The peer's own
`close()` closes the DefaultStager in use.
"""

from __future__ import annotations

import threading
from concurrent.futures import Future
from typing import Any

import torch
from torch.distributed.checkpoint.staging import AsyncStager, DefaultStager, StagingOptions

__all__ = ["FRESH_NOTE", "KeptStager", "staging_options"]

FRESH_NOTE = "fresh stager per save: torch {version} closes the stager given to async_save (torch issue 183413)"
CLOSE_BOUND_S = 30.0  # torch's done callbacks run right after the upload completes: a bound, not a wait


def staging_options(pinned: bool, staged: bool) -> StagingOptions:
    """The options of the `-pinned` and `-staged` peers (pinned memory and non-blocking copies need CUDA)."""
    gpu = pinned or torch.cuda.is_available()
    return StagingOptions(
        use_pinned_memory=gpu, use_shared_memory=staged, use_async_staging=staged, use_non_blocking_copy=gpu
    )


class _Forwarding(AsyncStager):
    """What `async_save` is given: the AsyncStager calls, forwarded; a close() from torch is recorded."""

    def __init__(self, stager: DefaultStager) -> None:
        self.stager = stager
        self.closed_by_torch = False
        self._synchronize_after_execute = stager.should_synchronize_after_execute

    def stage(self, state_dict: Any) -> Any:
        return self.stager.stage(state_dict)

    def synchronize_staging(self) -> None:
        self.stager.synchronize_staging()

    def close(self) -> None:
        self.closed_by_torch = True
        self.stager.close()


class KeptStager:
    """One DefaultStager for every save, or a fresh one per save where torch closes it (`note` then says so)."""

    def __init__(self, options: StagingOptions) -> None:
        self._options = options
        self._current = _Forwarding(DefaultStager(options))
        self._upload_done: threading.Event | None = None
        self.saves = 0  # DefaultStagers made for saves, the first included (1: kept across every save)
        self.note: str | None = None

    def for_save(self) -> _Forwarding:
        """The stager to pass to this save's `async_save`: the kept one, unless torch closed it."""
        if self._upload_done is not None:
            # torch closes the stager in a done callback of the upload future registered before ours: once ours
            # has run, torch's has too.
            self._upload_done.wait(CLOSE_BOUND_S)
        if self._current.closed_by_torch:
            self.note = FRESH_NOTE.format(version=torch.__version__)
            self._current = _Forwarding(DefaultStager(self._options))
            self.saves += 1
        self.saves = max(self.saves, 1)
        return self._current

    def track(self, upload: Future) -> None:
        """Call with the save's upload future, right after `async_save` returns."""
        done = self._upload_done = threading.Event()
        upload.add_done_callback(lambda _: done.set())

    def close(self) -> None:
        if not self._current.closed_by_torch:
            self._current.stager.close()
