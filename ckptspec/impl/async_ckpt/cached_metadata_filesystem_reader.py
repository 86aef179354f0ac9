"""A stock DCP ``FileSystemReader`` that reads a checkpoint's metadata once per reader and checks integrity.

Decision: the cache belongs to the reader instance, so a new reader always sees the checkpoint's current
metadata (a cache shared by path could serve stale metadata after the directory is rewritten).

Integrity (IN-1, IN-2): for a checkpoint that records checksums (``FileSystemWriterAsync`` writes them), a load
checks every byte of every file of the checkpoint and raises ``IntegrityError`` naming the file at the first
mismatch, which ``dcp.load`` raises on every rank:

* ``.metadata`` must end with an intact checksum trailer (every rank reads it);
* when the reader is set up for a load (on every rank), every data file must exist with its recorded size, and
  the items recorded for it must tile it from its first byte to its last, so that each byte lies in one item
  whose CRC32 ``.metadata`` holds;
* each item a rank reads for loading is checked against its CRC32 as it is read (no second pass);
* the items that no rank reads (an empty tensor has no read item; a partial load leaves others unread) are read
  and checked too: the coordinator's global plan hands them out, a file's at a time, to the rank with the fewest
  such bytes so far, so that the ranks share the reading and each byte is read once.

A checkpoint without checksums (a stock ``dcp.save``) loads as with the stock reader.
"""

from __future__ import annotations

import io
import os
import pickle
from dataclasses import replace
from typing import IO, Any, NamedTuple

from torch.distributed.checkpoint import FileSystemReader, Metadata
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import StorageMeta
from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
from torch.futures import Future

from ..integrity import TRAILER_SIZE, IntegrityError, crc32, unseal

__all__ = ["CachedMetadataFileSystemReader", "IntegrityError"]

_METADATA_LABEL = b"metadata"
_CHUNK = 16 << 20  # bytes read at a time when checking items no rank loads: a large one is never held whole


class _Segment(NamedTuple):
    """One item of a data file: where it lies and the CRC32 that ``.metadata`` recorded for it."""

    offset: int
    length: int
    crc: int


class _Unread(NamedTuple):
    """A load plan's ``storage_data``: the items of each file that the rank checks without loading them."""

    files: tuple[tuple[str, tuple[_Segment, ...]], ...]


class CachedMetadataFileSystemReader(FileSystemReader):
    """``FileSystemReader`` whose ``read_metadata`` reads ``.metadata`` on the first call only."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path=path)
        self._cached_metadata: Metadata | None = None
        self._files: dict[str, tuple[_Segment, ...]] = {}
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
        self._files = self._check_files(metadata)

    def prepare_global_plan(self, plans: list[LoadPlan]) -> list[LoadPlan]:
        """Each plan's ``storage_data`` also names the items that no plan reads and that its rank checks (``_Unread``)."""
        plans = super().prepare_global_plan(plans)
        if not self._files:
            return plans
        read = set()
        for plan in plans:
            for item in plan.items:
                info: _StorageInfo = self.storage_data[item.storage_index]
                read.add((info.relative_path, info.offset))
        unread = []
        for name, segments in self._files.items():
            left = tuple(s for s in segments if (name, s.offset) not in read)
            if left:
                unread.append((sum(s.length for s in left), name, left))
        shares: list[list[tuple[str, tuple[_Segment, ...]]]] = [[] for _ in plans]
        loads = [0] * len(plans)
        for size, name, left in sorted(unread, key=lambda u: -u[0]):
            rank = loads.index(min(loads))
            shares[rank].append((name, left))
            loads[rank] += size
        return [replace(plan, storage_data=_Unread(tuple(share))) for plan, share in zip(plans, shares, strict=True)]

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future[None]:
        if isinstance(plan.storage_data, _Unread):
            for name, segments in plan.storage_data.files:
                self._check_unread(name, segments)
        return super().read_data(plan, planner)

    def _check_files(self, metadata: Metadata) -> dict[str, tuple[_Segment, ...]]:
        """Each data file the checksums name, with its items in order; IntegrityError unless every file exists with
        its recorded size and its items tile it."""
        checksums = getattr(metadata, "checksums", None)
        if not checksums:
            return {}
        items: dict[str, set[_Segment]] = {}
        for info in metadata.storage_data.values():
            crc = checksums["items"].get((info.relative_path, info.offset))
            if crc is not None:
                items.setdefault(info.relative_path, set()).add(_Segment(info.offset, info.length, crc))
        files = {}
        for name, size in checksums["files"].items():
            path = self._data_path(name)
            try:
                actual = os.path.getsize(path)
            except FileNotFoundError:
                raise IntegrityError(f"checkpoint data file {path} is missing") from None
            if actual != size:
                raise IntegrityError(f"checkpoint data file {path} is damaged: {actual} bytes, {size} when saved")
            files[name] = _tiling(sorted(items.get(name, ())), size, path)
        return files

    def _check_unread(self, name: str, segments: tuple[_Segment, ...]) -> None:
        """Read each of ``segments`` of data file ``name``, a chunk at a time, and compare it with its CRC32."""
        with self.fs.create_stream(self.fs.concat_path(self.path, name), "rb") as f:
            for segment in segments:
                f.seek(segment.offset)
                value, left = 0, segment.length
                while left:
                    chunk = f.read(min(left, _CHUNK))
                    if not chunk:
                        break
                    value, left = crc32(chunk, value), left - len(chunk)
                if left or value != segment.crc:
                    raise self._damaged(name, segment.offset)

    def _slice_file(self, file: Any, sinfo: _StorageInfo) -> IO[bytes]:
        key = (sinfo.relative_path, sinfo.offset)
        if key not in self._item_crcs:
            return super()._slice_file(file, sinfo)
        file.seek(sinfo.offset)
        data = file.read(sinfo.length)
        expected = self._item_crcs[key]
        if len(data) != sinfo.length or (expected is not None and crc32(data) != expected):
            raise self._damaged(sinfo.relative_path, sinfo.offset)
        return io.BytesIO(data)

    def _data_path(self, name: str) -> str:
        return os.path.join(os.fspath(self.path), name)

    def _damaged(self, name: str, offset: int) -> IntegrityError:
        return IntegrityError(
            f"checkpoint data file {self._data_path(name)} is damaged: the item at offset {offset} does not match "
            "the CRC32 that .metadata recorded when it was saved"
        )


def _tiling(segments: list[_Segment], size: int, path: str) -> tuple[_Segment, ...]:
    """``segments`` (sorted), checked to cover the ``size`` bytes of the file at ``path`` back to back."""
    end = 0
    for segment in segments:
        if segment.offset != end:
            break
        end += segment.length
    if end != size:
        raise IntegrityError(
            f"checkpoint data file {path}: .metadata records no checksum for its bytes from offset {end}"
        )
    return tuple(segments)


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
