"""A stock DCP ``FileSystemReader`` that reads a checkpoint's metadata once per reader and checks integrity.

Decision: the cache belongs to the reader instance, so a new reader always sees the checkpoint's current
metadata (a cache shared by path could serve stale metadata after the directory is rewritten).

Integrity (IN-1, IN-2): for a checkpoint that records checksums (``FileSystemWriterAsync`` writes them),
``.metadata`` must end with an intact checksum trailer, every data file must exist with its recorded size, and
each item's bytes are checked against their CRC32 as they are read for loading (no second pass). Any mismatch
raises ``IntegrityError`` naming the file, which ``dcp.load`` raises on every rank. A checkpoint without
checksums (a stock ``dcp.save``) loads as with the stock reader.
"""

from __future__ import annotations

import io
import os
import pickle
from typing import IO, Any

from torch.distributed.checkpoint import FileSystemReader, Metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import StorageMeta

from ..integrity import TRAILER_SIZE, IntegrityError, crc32, unseal

__all__ = ["CachedMetadataFileSystemReader", "IntegrityError"]

_METADATA_LABEL = b"metadata"


class CachedMetadataFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``read_metadata`` reads ``.metadata`` on the first call only."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path=path)
        self._cached_metadata: Metadata | None = None
        self._item_crcs: dict[tuple[str, int], int | None] = {}

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        if self._cached_metadata is None:
            path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(path, "rb") as f:
                raw = f.read()
            metadata = _parse_metadata(raw, str(path))
            storage_meta = getattr(metadata, "storage_meta", None) or StorageMeta()
            storage_meta.load_id = self.load_id
            metadata.storage_meta = storage_meta
            self._check_files(metadata)
            self._cached_metadata = metadata
        return self._cached_metadata

    @classmethod
    def clear_metadata_cache(cls, path: str | os.PathLike[str] | None = None) -> None:
        """NVRx 0.7.0 keeps one metadata cache per path, shared by its readers, and this empties it (for ``path``, or
        all). Here a reader's cache is its own, so a new reader always reads the metadata afresh: nothing to do."""

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        checksums = getattr(metadata, "checksums", None)
        self._item_crcs = dict(checksums["items"]) if checksums else {}

    def _check_files(self, metadata: Metadata) -> None:
        """Every data file the checksums name exists with its recorded size."""
        checksums = getattr(metadata, "checksums", None)
        for name, size in (checksums or {}).get("files", {}).items():
            path = os.path.join(os.fspath(self.path), name)
            try:
                actual = os.path.getsize(path)
            except FileNotFoundError:
                raise IntegrityError(f"checkpoint data file {path} is missing") from None
            if actual != size:
                raise IntegrityError(f"checkpoint data file {path} is damaged: {actual} bytes, {size} when saved")

    def _slice_file(self, file: Any, sinfo: _StorageInfo) -> IO[bytes]:
        key = (sinfo.relative_path, sinfo.offset)
        if key not in self._item_crcs:
            return super()._slice_file(file, sinfo)
        file.seek(sinfo.offset)
        data = file.read(sinfo.length)
        expected = self._item_crcs[key]
        if len(data) != sinfo.length or (expected is not None and crc32(data) != expected):
            raise IntegrityError(
                f"checkpoint data file {os.path.join(os.fspath(self.path), sinfo.relative_path)} is damaged: "
                f"the item at offset {sinfo.offset} does not match the CRC32 that .metadata recorded when it was saved"
            )
        return io.BytesIO(data)


def _parse_metadata(raw: bytes, path: str) -> Metadata:
    sealed = len(raw) >= TRAILER_SIZE and raw[-TRAILER_SIZE:].startswith(b"CKPTCRC1")
    body = unseal(raw, _METADATA_LABEL, f"checkpoint metadata {path}") if sealed else raw
    try:
        metadata = pickle.loads(body)
    except Exception as exc:
        raise IntegrityError(f"checkpoint metadata {path} is damaged: it cannot be read ({exc!r})") from None
    if not isinstance(metadata, Metadata):
        raise IntegrityError(f"checkpoint metadata {path} is damaged: it holds a {type(metadata).__name__}")
    if not sealed and getattr(metadata, "checksums", None) is not None:
        raise IntegrityError(f"checkpoint metadata {path} is damaged: its checksum trailer is missing")
    return metadata
