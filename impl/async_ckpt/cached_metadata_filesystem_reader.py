"""A stock DCP ``FileSystemReader`` that reads a checkpoint's metadata once per reader.

Decision: the cache belongs to the reader instance, so a new reader always sees the checkpoint's current
metadata (a cache shared by path could serve stale metadata after the directory is rewritten).
"""

from __future__ import annotations

import os
from typing import Any

from torch.distributed.checkpoint import FileSystemReader, Metadata

__all__ = ["CachedMetadataFileSystemReader"]


class CachedMetadataFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``read_metadata`` reads ``.metadata`` on the first call only."""

    def __init__(self, path: str | os.PathLike) -> None:
        super().__init__(path=path)
        self._cached_metadata: Metadata | None = None

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._cached_metadata is None:
            self._cached_metadata = super().read_metadata(*args, **kwargs)
        return self._cached_metadata
