"""The DefaultStager a DCP staged peer saves with: one kept across saves where the torch release allows it.

torch 2.11's `DefaultStager` closes its own copier (`StateDictStager.close()`, which empties its copy table) at the
end of every `stage()`, so a second stage through the same DefaultStager raises `KeyError: <class 'type'>` (torch
issue 183413; seen on the H100 and H200 runs, and reproduced with 2.11 on a CPU). torch 2.13 keeps it, and
documents that a caller who passes a stager to `dcp.async_save` closes it after the last save.

`stager_reusable()` asks the installed torch once per process, by staging a small state dict twice through one
DefaultStager. `KeptStager` then gives every save the same DefaultStager, or a fresh one per save where the release
cannot reuse it (a fresh one pins new host memory on every save on a GPU: the honest cost of that release), and
says so in `note`, for the benchmark's row. The peer's `close()` closes the DefaultStager in use.
"""

from __future__ import annotations

import functools

import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

__all__ = ["FRESH_NOTE", "KeptStager", "stager_reusable", "staging_options"]

FRESH_NOTE = "fresh stager per save: torch {version}'s DefaultStager cannot stage twice (torch issue 183413)"


def staging_options(pinned: bool, staged: bool) -> StagingOptions:
    """The options of the `-pinned` and `-staged` peers (pinned memory and non-blocking copies need CUDA)."""
    gpu = pinned or torch.cuda.is_available()
    return StagingOptions(
        use_pinned_memory=gpu, use_shared_memory=staged, use_async_staging=staged, use_non_blocking_copy=gpu
    )


@functools.cache
def stager_reusable() -> bool:
    """Whether one DefaultStager of the installed torch stages twice (synchronous, CPU-only options: no memory is
    pinned or shared by the probe)."""
    stager = DefaultStager(StagingOptions(False, False, False, False))
    probe = {"probe": {"t": torch.zeros(4)}, "step": 0}
    try:
        stager.stage(probe)
        stager.stage(probe)
    except KeyError:
        return False
    finally:
        stager.close()
    return True


class KeptStager:
    """One DefaultStager for every save, or a fresh one per save where torch cannot reuse it (`note` says so)."""

    def __init__(self, options: StagingOptions) -> None:
        self._options = options
        self._current: DefaultStager | None = None
        self.made = 0  # DefaultStagers made for saves (1: kept across every save)
        self.note: str | None = None if stager_reusable() else FRESH_NOTE.format(version=torch.__version__)

    def for_save(self) -> DefaultStager:
        """The stager to pass to this save's `async_save` (call once the previous save's staging has completed)."""
        if self._current is not None and self.note is None:
            return self._current
        self.close()
        self._current = DefaultStager(self._options)
        self.made += 1
        return self._current

    def close(self) -> None:
        if self._current is not None:
            self._current.close()
            self._current = None
