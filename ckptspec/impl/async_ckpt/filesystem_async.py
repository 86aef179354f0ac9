"""A torch.distributed.checkpoint (DCP) storage writer that plans in the trainer and writes in the background.

Flow (signature-compatible with NVRx ``async_ckpt.filesystem_async``):

1. ``save_state_dict_async_plan`` plans the save and calls ``prepare_write_data`` (in the trainer). It groups
   the plan's items into at most ``thread_count`` buckets, one data file each.
2. ``get_save_function_and_args()`` returns ``(save_fn, preload_fn, save_args)`` for
   ``AsyncRequest(save_fn, save_args, finalize_fns, preload_fn=preload_fn)``. ``save_fn(*save_args)`` writes
   the buckets in parallel threads, in whatever process runs it, and leaves the write results (or the error)
   in a small local file that ``retrieve_write_results()`` reads back and removes in the trainer. On POSIX it is
   a hidden file of the checkpoint directory (``.write-results-{rank}-{save_id}``), so a trainer killed
   mid-save leaves nothing outside the torn checkpoint; through Multi-Storage Client, a file of the local
   temporary directory.
3. ``save_state_dict_async_finalize`` gathers every rank's results and the coordinator calls ``finish``.

Commit protocol:

* Planning refuses a path that is a file or that already holds a checkpoint (``.metadata``): nothing is
  written then, and an existing checkpoint is never overwritten.
* Each rank writes only its own data files and fsyncs each one (and, on POSIX, the directory) before it
  reports success; a failure is reported, never raised in the background, so that finalization can tell
  every rank.
* ``finish`` runs on the coordinator only, once every rank reported success. On POSIX it writes
  ``.metadata.tmp``, fsyncs it, renames it to ``.metadata`` and fsyncs the directory, so ``.metadata`` is
  never seen partially written. Through Multi-Storage Client, ``.metadata`` is one object written after every
  data object's upload returned: an object store makes a PUT visible whole or not at all, and MSC's POSIX
  provider writes a temporary file, fsynced here, that it renames on close.
* So a failed save leaves no ``.metadata`` in its directory and touches no other directory.

Every file operation goes through one ``storage.Storage`` (POSIX or MSC), picked from ``use_msc`` at construction.

Layout: data files are named ``{group}__{rank}_{k}.distcp``: ``group`` is ``""``, or ``separation_hint``
for the items whose key starts with it, and ``k`` counts a rank's files from 0.

Copies: the writer copies no CPU tensor in the trainer. The async core that runs ``save_fn`` takes the
snapshot of its arguments when the request is scheduled (a copy into shared memory, or a fork), so
``preload_fn`` is ``None`` unless CUDA tensors must be staged to host memory (pinned buffers; the GPU path is
untested, this was written on a CPU-only machine). A tensor viewing a larger storage is copied when it is
written, since ``torch.save`` would write the whole storage; tensor bytes otherwise go from the staged tensor
straight into the file.

Integrity (IN-1): each item's CRC32 is computed while it is written (``ChecksumStream``: a tensor's bytes are
hashed once, by torch's zip writer, whose CRC32 of them is combined with that of the bytes around them); ``finish``
records them with every file's size in ``metadata.checksums`` and appends a checksum trailer to ``.metadata`` (after
the pickle, which stock readers stop before). A file's items lie back to back from its first byte to its last, so
their CRC32s cover every byte of it. ``CachedMetadataFileSystemReader`` checks all of it at load.

Equivalence with torch's synchronous ``FileSystemWriter`` (FS-18): without ``separation_hint``, the data files
are byte-identical to its files for the same plan and ``thread_count``: the same buckets (``_split_by_size_and_type``
is torch's), items in the same order (the plan's, or smallest tensor first where torch's writer stages them through
``_OverlappingCpuLoader``: one thread on a machine with CUDA, ``_torch_stages_smallest_first``), each written by
``torch.save`` with torch's default settings (CRC32 on), and the same copy of views (``_compact``).

Simplifications: one file per bucket (no ``single_file_per_rank=False``); tensors are serialized with
``torch.save``, which is what the stock ``FileSystemReader`` reads; no stream transforms; ``write_data`` (the
synchronous ``dcp.save`` path) is not supported.
"""

from __future__ import annotations

import contextlib
import functools
import heapq
import io
import logging
import os
import pickle
import uuid
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from math import prod
from typing import IO, Any, NamedTuple, NoReturn, cast

import torch
from torch.distributed.checkpoint.filesystem import CURRENT_DCP_VERSION, _StorageInfo, _StoragePrefix
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult

from ..integrity import ChecksumStream, crc32, open_new, seal
from ..phases import mark
from ..utils import dist_rank
from .staging import copies_to_host, wait_landed, waits_for_landing
from .storage import Storage, storage_for

__all__ = ["ChecksummedWriteResult", "FileSystemWriterAsync", "ResultRow", "WriteBucket", "WriteTemplate", "results_of"]

logger = logging.getLogger(__name__)

METADATA_NAME = ".metadata"
METADATA_LABEL = b"metadata"
DATA_SUFFIX = ".distcp"


@dataclass(frozen=True)
class ChecksummedWriteResult(WriteResult):
    """A WriteResult with the CRC32 of the item's bytes, computed while they were written."""

    crc32: int = 0


ResultRow = tuple[str, tuple[int, ...] | None, int | None, int, str, int, int, int]
"""A write result as plain values, as the worker hands it to the trainer: index (fqn, offset, index hint),
size_in_bytes, storage data (file, offset, length), CRC32. Unpickling 10,000 WriteResult objects costs about 0.2-0.4 s
(a dataclass and a ``__setstate__`` each); their rows, a few ms, and rebuilding the objects about 30 ms."""


def _rows(results: list[WriteResult]) -> list[ResultRow]:
    return [
        (
            r.index.fqn,
            None if r.index.offset is None else tuple(r.index.offset),
            r.index.index,
            r.size_in_bytes,
            r.storage_data.relative_path,
            r.storage_data.offset,
            r.storage_data.length,
            getattr(r, "crc32", 0),
        )
        for r in results
    ]


def results_of(rows: list[ResultRow]) -> list[WriteResult]:
    """The WriteResult objects of ``rows`` (``FileSystemWriterAsync.retrieve_write_rows``)."""
    return [
        ChecksummedWriteResult(
            index=MetadataIndex(fqn, offset, hint),
            size_in_bytes=size,
            storage_data=_StorageInfo(path, start, length),
            crc32=crc,
        )
        for fqn, offset, hint, size, path, start, length, crc in rows
    ]


class WriteBucket(NamedTuple):
    """One data file: where it goes, its name in the metadata, and its (item, data) pairs."""

    path: str
    relative_path: str
    data: tuple[list[tuple[WriteItem, io.BytesIO]], list[tuple[WriteItem, torch.Tensor]]]


class WriteTemplate(NamedTuple):
    """A save's buckets without their data: per file (name, [(byte item, value index)], [tensor item], [its value
    index]), and the writer settings they were made with (``FileSystemWriterAsync.write_template``)."""

    settings: tuple[Any, ...]
    buckets: tuple[tuple[str, tuple[tuple[WriteItem, int], ...], tuple[WriteItem, ...], tuple[int, ...]], ...]


class FileSystemWriterAsync(StorageWriter):
    """DCP StorageWriter whose writes run through ``get_save_function_and_args`` (see the module docstring).

    ``path`` is a directory, or with ``use_msc=True`` an ``msc://<profile>/<path>`` URL (or a local path) written
    through Multi-Storage Client. Bad arguments raise ValueError here, before anything is written.
    ``checksums=False`` (not an NVRx parameter) records no checksums, for measuring their cost.
    """

    can_run_decentralized_global_plan = True

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        thread_count: int = 1,
        separation_hint: str | None = None,
        use_msc: bool = False,
        checksums: bool = True,
    ):
        super().__init__()
        path = os.fspath(path)
        _check_arguments(thread_count, separation_hint)
        self.thread_count = thread_count
        self.separation_hint = separation_hint
        self.use_msc = use_msc
        self.checksums = checksums  # IN-1; off only to measure what they cost
        self._storage: Storage = storage_for(use_msc)  # the only place use_msc is looked at
        self.checkpoint_dir = self._storage.init_path(path)
        self.save_id = str(uuid.uuid4())
        self.write_buckets: list[WriteBucket] | None = None
        self._results_path: str | None = None
        self._cleanup: weakref.finalize[[str], FileSystemWriterAsync] | None = None
        self._prepare_error: Exception | None = None

    # ---------------------------------------------------------------------- StorageWriter protocol

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:
        if checkpoint_id:
            self.checkpoint_dir = self._storage.init_path(os.fspath(checkpoint_id))
        self.save_id = str(uuid.uuid4())

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        """Nothing to set up: every rank plans alike, and only the coordinator is ever asked to ``finish``."""

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        """Refuse a path that is a file or holds a checkpoint (the directory is created once every rank planned)."""
        storage = self._storage
        if storage.is_file(self.checkpoint_dir):
            raise NotADirectoryError(f"checkpoint path {self.checkpoint_dir!r} is a file, not a directory")
        if storage.is_file(storage.concat_path(self.checkpoint_dir, METADATA_NAME)):
            raise FileExistsError(
                f"{self.checkpoint_dir!r} already holds a checkpoint ({METADATA_NAME}); "
                "FileSystemWriterAsync never overwrites one: save into a new directory"
            )
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        """Give plan i the file prefix ``__{i}_``."""
        return [_with_prefix(plan, i) for i, plan in enumerate(plans)]

    def prepare_decentralized_global_plan(self, local_plan: SavePlan) -> SavePlan:
        """Same prefix as ``prepare_global_plan`` would give, from this rank's own rank."""
        return _with_prefix(local_plan, dist_rank())

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> NoReturn:
        raise NotImplementedError(
            "FileSystemWriterAsync writes through save_state_dict_async_plan, get_save_function_and_args "
            "and save_state_dict_async_finalize, not through torch.distributed.checkpoint.save"
        )

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:
        """Coordinator only, after every rank wrote: commit ``.metadata`` atomically."""
        flat = [wr for rank_results in results for wr in rank_results]
        metadata.storage_data = {wr.index: wr.storage_data for wr in flat}
        metadata.storage_meta = self.storage_meta()
        metadata.version = CURRENT_DCP_VERSION
        if self.checksums:
            metadata.checksums = _checksums(flat)  # type: ignore[attr-defined]  # stock readers ignore it
        data = pickle.dumps(metadata)
        if self.checksums:
            data += seal(crc32(data), len(data), METADATA_LABEL)  # pickle.load stops before the trailer
        path = self._storage.concat_path(self.checkpoint_dir, METADATA_NAME)
        self._storage.write_atomically(path, data)
        mark("committed")

    def storage_meta(self) -> StorageMeta | None:
        return StorageMeta(checkpoint_id=self.checkpoint_id, save_id=self.save_id)

    @property
    def checkpoint_id(self) -> str:
        return self.checkpoint_dir

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    # ---------------------------------------------------------------------------- async protocol

    def prepare_write_data(self, plan: SavePlan, planner: SavePlanner) -> None:
        """Group the plan's items into buckets and resolve their data (no tensor is copied here).

        An error is kept and reported by ``retrieve_write_results``, so that finalization raises it on
        every rank instead of this rank alone leaving the collective protocol.
        """
        self._use_buckets(lambda: self._buckets(plan, planner))

    def write_template(self, locate: Callable[[WriteItem], int]) -> WriteTemplate:
        """The prepared buckets with each item's data named by ``locate(item)`` (its place among the state dict's
        values), for ``prepared_buckets`` to fill from the next state dict of the same structure."""
        assert self.write_buckets is not None  # after prepare_write_data
        return WriteTemplate(
            self._settings(),
            tuple(
                (
                    bucket.relative_path,
                    tuple((item, locate(item)) for item, _ in bucket.data[0]),
                    tuple(item for item, _ in bucket.data[1]),
                    tuple(locate(item) for item, _ in bucket.data[1]),
                )
                for bucket in self.write_buckets
            ),
        )

    def prepared_buckets(
        self,
        template: WriteTemplate,
        values: list[Any],
        to_bytes: Callable[[WriteItem, Any], Any],
        detach: bool = True,
    ) -> list[WriteBucket] | None:
        """This writer's buckets from ``template`` and the state dict's ``values`` (byte items through
        ``to_bytes``; each tensor detached where it requires grad, unless the caller knows none does: ``detach``
        False), or None when the template was made for other writer settings. Creates nothing."""
        if template.settings != self._settings():
            return None
        concat, directory = self._storage.concat_path, self.checkpoint_dir
        take = values.__getitem__
        return [
            WriteBucket(
                concat(directory, name),
                name,
                (
                    [(i, to_bytes(i, values[k])) for i, k in byte_items],
                    # zip and map, not a comprehension: a state dict's 10,000 tensors in about 1 ms instead of 5
                    list(zip(items, map(_detached, map(take, at)) if detach else map(take, at), strict=True)),
                ),
            )
            for name, byte_items, items, at in template.buckets
        ]

    def use_write_buckets(self, buckets: list[WriteBucket]) -> None:
        """Write ``buckets`` (from ``prepared_buckets``): what ``prepare_write_data`` does with the plan's."""
        self._use_buckets(lambda: buckets)

    def _settings(self) -> tuple[Any, ...]:
        return (type(self._storage), self.thread_count, self.separation_hint)

    def _use_buckets(self, build: Callable[[], list[WriteBucket]]) -> None:
        self._discard_results()
        self._prepare_error = None
        try:
            self._storage.mkdir(self.checkpoint_dir)  # here, not at planning: a refused save creates nothing
            self.write_buckets = build()
        except Exception as exc:
            self._prepare_error, self.write_buckets = exc, []
        if self.write_buckets:
            self._results_path = self._storage.results_path(self.checkpoint_dir, dist_rank(), self.save_id)
            self._cleanup = weakref.finalize(self, _remove_quietly, self._results_path)

    def get_save_function_and_args(self) -> tuple[Callable[..., None] | None, Callable[[], Any] | None, Any]:
        """``(save_fn, preload_fn, save_args)``, or ``(None, None, ())`` when this rank writes nothing.

        ``save_args`` is ``[rank, write_buckets, results_path]``; ``preload_fn()``, when not None, returns the
        buckets staged to host memory (it replaces ``save_args[1]``).
        """
        if not self.write_buckets:
            return None, None, ()
        preload_fn = None
        if any(t.is_cuda for bucket in self.write_buckets for _, t in bucket.data[1]):
            preload_fn = functools.partial(self.preload_tensors, self.write_buckets, True)
        save_fn = functools.partial(_write_all, self._storage, checksums=self.checksums)
        return save_fn, preload_fn, [dist_rank(), self.write_buckets, self._results_path]

    @staticmethod
    @copies_to_host  # an overlapped queue stages the buckets itself (async_ckpt.overlap)
    def preload_tensors(write_buckets: list[WriteBucket], non_blocking: bool = True) -> list[WriteBucket]:
        """The buckets with every tensor copied to host memory now (CUDA ones into pinned buffers).

        CPU tensors are copied too, so that every tensor is snapshotted at the same point.
        """

        # Not yet run with CUDA tensors (the H100 run of 2026-11-27 gave it CPU tensors only).
        def stage(t: torch.Tensor) -> torch.Tensor:
            if not t.is_cuda:
                return t.clone()
            host = torch.empty_like(t, device="cpu", pin_memory=non_blocking)  # keeps a dense tensor's strides
            return host.copy_(t, non_blocking=non_blocking)

        staged = [b._replace(data=(b.data[0], [(item, stage(t)) for item, t in b.data[1]])) for b in write_buckets]
        if non_blocking and torch.cuda.is_available():
            torch.cuda.synchronize()
        return staged

    def retrieve_write_results(self) -> list[WriteResult]:
        """This rank's write results, once ``save_fn`` has run; raises if preparing or writing failed."""
        return results_of(self.retrieve_write_rows())

    def retrieve_write_rows(self) -> list[ResultRow]:
        """``retrieve_write_results`` as plain rows (``ResultRow``), what the finalize gathers between ranks: the
        objects are rebuilt on the coordinator alone (``results_of``)."""
        if self._prepare_error is not None:
            raise RuntimeError(f"preparing the write data failed: {self._prepare_error!r}") from self._prepare_error
        if not self.write_buckets:
            return []
        if self._results_path is None:
            raise RuntimeError("the write results of this save were already retrieved")
        try:
            with open(self._results_path, "rb") as f:
                outcome = pickle.load(f) if os.fstat(f.fileno()).st_size else None
        except FileNotFoundError:
            outcome = None
        finally:
            self._discard_results()
        if outcome is None:
            raise RuntimeError(
                f"no write results for {self.checkpoint_dir!r}: the save function did not run to the end"
            )
        if isinstance(outcome, BaseException):
            raise outcome
        return cast(list[ResultRow], outcome)

    # ----------------------------------------------------------------------------------- helpers

    def _buckets(self, plan: SavePlan, planner: SavePlanner) -> list[WriteBucket]:
        prefix = plan.storage_data.prefix
        buckets: list[WriteBucket] = []
        smallest_first = _torch_stages_smallest_first(self.thread_count)
        for group, items, bins in self._groups(plan.items):
            for bucket_items in _split_by_size_and_type(bins, items):
                if smallest_first:
                    bucket_items = sorted(bucket_items, key=_size_or_zero)  # stable, as torch's list.sort
                name = f"{group}{prefix}{len(buckets)}{DATA_SUFFIX}"
                # resolve_data gives a BytesIO for a BYTE_IO item and a tensor for any other.
                bytes_data = [
                    (i, cast(io.BytesIO, planner.resolve_data(i)))
                    for i in bucket_items
                    if i.type == WriteItemType.BYTE_IO
                ]
                tensor_data = [
                    (i, _detached(cast(torch.Tensor, planner.resolve_data(i))))
                    for i in bucket_items
                    if i.type != WriteItemType.BYTE_IO
                ]
                path = self._storage.concat_path(self.checkpoint_dir, name)
                buckets.append(WriteBucket(path, name, (bytes_data, tensor_data)))
        return buckets

    def _groups(self, items: list[WriteItem]) -> list[tuple[str, list[WriteItem], int]]:
        """(file name group, its items, its number of files), splitting the thread budget by the hint."""
        hint = self.separation_hint
        if hint is None:
            return [("", items, self.thread_count)]
        hinted = [i for i in items if i.index.fqn.startswith(hint)]
        others = [i for i in items if not i.index.fqn.startswith(hint)]
        half = self.thread_count // 2
        return [("", others, self.thread_count - half), (hint, hinted, half)]

    def _discard_results(self) -> None:
        if self._cleanup is not None:
            self._cleanup()
        self._results_path = self._cleanup = None


# ------------------------------------------------------------------------------------- the write


@waits_for_landing  # each tensor is written once its bytes have landed in the slab (staging)
def _write_all(
    storage: Storage, rank: int, buckets: list[WriteBucket], results_path: str, checksums: bool = True
) -> None:
    """Write each bucket to its file in its own thread, then record the results or the first error.

    Never raises for a failed write: the error is recorded for ``retrieve_write_results``.
    """
    with ThreadPoolExecutor(max_workers=len(buckets), thread_name_prefix="ckpt-write") as pool:
        write = functools.partial(_try_write_bucket, storage, rank, checksums=checksums)
        outcomes = list(pool.map(write, buckets))
    errors = [o for o in outcomes if isinstance(o, BaseException)]
    written = [o for o in outcomes if not isinstance(o, BaseException)]
    if not errors:
        try:
            storage.sync_dir(os.path.dirname(buckets[0].path))
            mark("durable")
        except OSError as exc:
            errors.append(RuntimeError(f"rank {rank}: syncing the checkpoint directory failed: {exc!r}"))
    outcome = errors[0] if errors else _rows([result for results in written for result in results])
    tmp = results_path + ".tmp"
    with open_new(tmp) as f:
        pickle.dump(outcome, f)
    os.replace(tmp, results_path)


def _try_write_bucket(
    storage: Storage, rank: int, bucket: WriteBucket, checksums: bool = True
) -> list[WriteResult] | Exception:
    try:
        return _write_bucket(storage, bucket, checksums)
    except Exception as exc:
        logger.error("rank %d: writing %s failed: %r", rank, bucket.path, exc)
        return RuntimeError(f"rank {rank}: writing {bucket.path} failed: {exc!r}")


def _write_bucket(storage: Storage, bucket: WriteBucket, checksums: bool = True) -> list[WriteResult]:
    bytes_data, tensor_data = bucket.data
    results = []
    with storage.create_stream(bucket.path) as raw:
        # each item's CRC32, computed on the bytes as they are written (not at all without checksums: its cost)
        stream = ChecksumStream(raw, enabled=checksums, read_back=storage.reader(bucket.path))
        mark("first byte")
        for item, data in bytes_data:
            results.append(_write_item(stream, item, bucket.relative_path, data))
        for item, tensor in tensor_data:
            wait_landed(tensor)  # written as soon as its copy is in, while the trainer copies the next
            results.append(_write_item(stream, item, bucket.relative_path, _compact(tensor)))
        mark("last byte")
    return results


def _write_item(
    stream: ChecksumStream, item: WriteItem, relative_path: str, data: io.BytesIO | torch.Tensor
) -> WriteResult:
    offset = stream.tell()
    if isinstance(data, torch.Tensor):
        with stream.zip_records():  # the payload's CRC32 is torch's own (integrity module docstring)
            torch.save(data, cast(IO[bytes], stream))
    else:
        stream.write(data.getbuffer())
    length = stream.tell() - offset
    info = _StorageInfo(relative_path, offset, length)
    return ChecksummedWriteResult(index=item.index, size_in_bytes=length, storage_data=info, crc32=stream.take())


def _checksums(results: list[WriteResult]) -> dict[str, Any]:
    """What ``.metadata`` records to check every data byte at load (IN-1): plain types only, so stock readers
    unpickle it. ``items`` maps (file, offset) to the item's CRC32; ``files`` gives each file's size."""
    items: dict[tuple[str, int], int | None] = {}
    files: dict[str, int] = {}
    for wr in results:
        info = wr.storage_data
        items[(info.relative_path, info.offset)] = getattr(wr, "crc32", None)
        files[info.relative_path] = max(files.get(info.relative_path, 0), info.offset + info.length)
    return {"algorithm": "crc32", "items": items, "files": files}


def _detached(t: torch.Tensor) -> torch.Tensor:
    """``t`` out of autograd's reach (a detach costs about 1 us, so only where it is needed)."""
    return t.detach() if t.requires_grad else t


def _compact(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a copy of only its elements when it views a larger storage (torch.save writes whole storages).

    The test and the copy (``clone`` keeps the memory format) are torch's ``FileSystemWriter``'s.
    """
    if t.untyped_storage().nbytes() != t.nbytes:
        return t.clone()
    return t


def _split_by_size_and_type(bins: int, items: list[WriteItem]) -> list[list[WriteItem]]:
    """Non-empty buckets, exactly as torch's ``FileSystemWriter`` forms them (so the files are byte-identical).

    One bin keeps the plan's order; otherwise byte items go round-robin, then tensors, largest first, into
    the lightest bucket (the first of equally light ones). Empty buckets can only be the last ones.
    """
    if bins == 1:
        return [items] if items else []
    buckets: list[list[WriteItem]] = [[] for _ in range(bins)]
    byte_items = [i for i in items if i.type == WriteItemType.BYTE_IO]
    tensor_items = sorted((i for i in items if i.type != WriteItemType.BYTE_IO), key=_item_size, reverse=True)
    for n, item in enumerate(byte_items):
        buckets[n % bins].append(item)
    heap = [(0, b) for b in range(bins)]
    for item in tensor_items:
        size, b = heapq.heappop(heap)
        buckets[b].append(item)
        heapq.heappush(heap, (size + _item_size(item), b))
    return [bucket for bucket in buckets if bucket]


def _torch_stages_smallest_first(thread_count: int) -> bool:
    """Whether torch's synchronous ``FileSystemWriter`` with ``thread_count`` threads writes each file's tensors
    smallest first, on this machine.

    It does when it stages them through ``_OverlappingCpuLoader``, which sorts them by size (a stable sort): torch
    2.11 to 2.15 pick that loader for one thread when CUDA or the PrivateUse1 device is available and
    ``per_thread_copy_ahead`` (10 MB by default) is positive, ``_SerialCpuLoader`` (the plan's order) otherwise
    (``torch.distributed.checkpoint.filesystem._write_files_from_queue``). Byte items come first either way. This is
    the same test, made in the trainer, which is where torch's own writer makes it.
    """
    if thread_count != 1:
        return False
    if torch.cuda.is_available():
        return True
    device = getattr(torch, torch._C._get_privateuse1_backend_name(), None)
    return bool(device is not None and device.is_available())


def _size_or_zero(item: WriteItem) -> int:
    """A tensor item's size (``_item_size``); 0 for a byte item, which torch writes before every tensor."""
    return 0 if item.type == WriteItemType.BYTE_IO else _item_size(item)


def _item_size(item: WriteItem) -> int:
    """The bytes of the whole tensor (torch's measure, also for a chunk of a sharded tensor)."""
    assert item.tensor_data is not None  # only tensor items are sized
    return prod(item.tensor_data.size) * item.tensor_data.properties.dtype.itemsize


# --------------------------------------------------------------------------------- validation


def _check_arguments(thread_count: int, separation_hint: str | None) -> None:
    if not isinstance(thread_count, int) or isinstance(thread_count, bool) or thread_count < 1:
        raise ValueError(f"thread_count must be an int >= 1, got {thread_count!r}")
    if separation_hint is not None:
        if not isinstance(separation_hint, str) or not separation_hint or "/" in separation_hint:
            raise ValueError(f"separation_hint must be a non-empty string without '/', got {separation_hint!r}")
        if thread_count < 2:
            raise ValueError(f"separation_hint needs thread_count >= 2 (one file per group), got {thread_count}")


def _with_prefix(plan: SavePlan, rank: int) -> SavePlan:
    return replace(plan, storage_data=_StoragePrefix(f"__{rank}_"))


def _remove_quietly(path: str) -> None:
    for name in (path, path + ".tmp"):
        with contextlib.suppress(FileNotFoundError):
            os.remove(name)
