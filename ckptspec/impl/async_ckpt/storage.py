"""Where ``FileSystemWriterAsync`` puts a checkpoint: local files, or Multi-Storage Client (MSC) objects.

A small interface in the spirit of torch DCP's ``FileSystemBase``. The writer picks one ``Storage``
(``storage_for(use_msc)``) and uses only these methods, so its commit protocol reads the same for both:

* ``init_path`` validates a checkpoint location and returns the one to use (ValueError if unusable);
* ``create_stream`` opens a file for writing; it is durable once the ``with`` block exits without
  an error (flushed and fsynced);
* ``sync_dir`` makes a directory's entries durable;
* ``write_atomically`` commits a small file that readers see whole or not at all;
* ``results_path`` names the local file where a save leaves its write results.

Instances hold no state: they are pickled along with the save function into the worker.
"""

from __future__ import annotations

import os
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import IO, Any

from ..integrity import file_reader, make_dirs, open_new

__all__ = ["MSC_SCHEME", "MscStorage", "PosixStorage", "Storage", "storage_for"]

MSC_SCHEME = "msc://"


class Storage(ABC):
    """The file operations a checkpoint save needs."""

    @abstractmethod
    def init_path(self, path: str) -> str:
        """The checkpoint location to use for ``path``; ValueError if this storage cannot write it."""

    @abstractmethod
    def concat_path(self, directory: str, name: str) -> str:
        """The path of ``name`` inside ``directory``."""

    @abstractmethod
    def is_file(self, path: str) -> bool:
        """Whether ``path`` is an existing file (object)."""

    @abstractmethod
    def mkdir(self, path: str) -> None:
        """Create directory ``path`` and its parents where the storage has directories."""

    @abstractmethod
    def create_stream(self, path: str) -> AbstractContextManager[IO[bytes]]:
        """Context manager: a binary stream writing ``path``, durable once the block exits cleanly."""

    def reader(self, path: str) -> Callable[[int, int], bytes] | None:
        """``read(offset, nbytes)`` of a file being written through ``create_stream``, or None where a file being
        written cannot be read back (then every byte is checksummed as it is written)."""
        return None

    @abstractmethod
    def sync_dir(self, path: str) -> None:
        """Make the entries of directory ``path`` durable (no-op where there are no directories)."""

    @abstractmethod
    def write_atomically(self, path: str, data: bytes) -> None:
        """Write ``path`` so that readers see all of ``data`` or no file at all, durably."""

    @abstractmethod
    def results_path(self, checkpoint_dir: str, rank: int, save_id: str) -> str:
        """A new local file for the write results of save ``save_id`` on ``rank``."""


class PosixStorage(Storage):
    """Local files: fsync for durability, tmp + fsync + rename + directory fsync for the commit."""

    def init_path(self, path: str) -> str:
        if path.startswith(MSC_SCHEME):
            raise ValueError(f"{path!r} is a Multi-Storage Client URL: pass use_msc=True to write it")
        return os.path.abspath(path)  # the writer may run in another process, with another cwd

    def concat_path(self, directory: str, name: str) -> str:
        return os.path.join(directory, name)

    def is_file(self, path: str) -> bool:
        return os.path.isfile(path)

    def mkdir(self, path: str) -> None:
        make_dirs(path)  # never group- or world-writable (IN-5)

    @contextmanager
    def create_stream(self, path: str) -> Iterator[IO[bytes]]:
        with open_new(path) as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())

    def reader(self, path: str) -> Callable[[int, int], bytes]:
        return file_reader(path)

    def sync_dir(self, path: str) -> None:
        fd = os.open(path or ".", os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def write_atomically(self, path: str, data: bytes) -> None:
        tmp = path + ".tmp"
        with self.create_stream(tmp) as f:
            f.write(data)
        os.rename(tmp, path)
        self.sync_dir(os.path.dirname(path))

    def results_path(self, checkpoint_dir: str, rank: int, save_id: str) -> str:
        # Hidden in the checkpoint directory: a trainer killed mid-save leaves nothing elsewhere.
        return os.path.join(checkpoint_dir, f".write-results-{rank}-{save_id}")


class MscStorage(Storage):
    """Multi-Storage Client: files are objects; MSC creates parent directories itself where there are any."""

    def init_path(self, path: str) -> str:
        import multistorageclient as msc

        try:
            msc.resolve_storage_client(path)
        except ValueError as exc:
            raise ValueError(f"cannot write {path!r} through Multi-Storage Client: {exc}") from exc
        return path

    def concat_path(self, directory: str, name: str) -> str:
        return directory.rstrip("/") + "/" + name

    def is_file(self, path: str) -> bool:
        import multistorageclient as msc

        return msc.is_file(path)

    def mkdir(self, path: str) -> None:
        pass

    @contextmanager
    def create_stream(self, path: str) -> Iterator[Any]:  # MSC's file objects are not typed as IO
        import multistorageclient as msc

        with msc.open(path, "wb") as stream:
            yield stream
            stream.flush()
            stream.fsync()  # POSIX provider: fsync of its temporary file; object stores upload on close

    def sync_dir(self, path: str) -> None:
        pass  # no directory handle through MSC

    def write_atomically(self, path: str, data: bytes) -> None:
        with self.create_stream(path) as f:  # one PUT, or a renamed temporary file for the POSIX provider
            f.write(data)

    def results_path(self, checkpoint_dir: str, rank: int, save_id: str) -> str:
        # A local temporary file: the checkpoint location may be an object store.
        fd, path = tempfile.mkstemp(prefix="ckpt-write-results-")
        os.close(fd)
        return path


def storage_for(use_msc: bool) -> Storage:
    """The storage of a ``FileSystemWriterAsync(use_msc=...)``."""
    return MscStorage() if use_msc else PosixStorage()
