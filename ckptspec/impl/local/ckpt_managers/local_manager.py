"""``LocalCheckpointManager``: local checkpoint parts as files in a per-rank directory.

Layout: ``<root_local_ckpt_dir>/<session_id>/<rank>/iter_<iteration:07d>_<owner>_<tag>.pt`` where tag is
``local`` for a part saved without replication, else the strategy's placement tag (e.g. ``w4c0-1``).
A part being written carries the extra suffix ``.dirty``; it is renamed to the clean name only when
the save is finalized. Each file is ``torch.save`` of the part's TensorAwareStateDict followed by a trailer
with the CRC32 of those bytes and the part's (iteration, owner), computed while writing (``ckptspec.impl.integrity``),
flushed to disk before it is reported written. Other files in the directory are never touched.

Integrity and safety (IN-*): ``find_latest`` checks every part it counts, so a part damaged after its save
(truncated, a flipped bit, another part copied over it) is logged and left out, and an intact replica takes its
place where one exists; ``load`` checks the part again as it reads it and raises ``CheckpointingException``
naming the file. Parts load with ``torch.load(weights_only=True)``: besides tensors and plain containers, only
the classes in ``SAFE_GLOBALS``, those the user allows with ``torch.serialization.add_safe_globals`` and the
program's own TensorAwareStateDict subclasses can be unpickled (``part_globals``), so a planted file cannot run
code; a state dict that could not be loaded back is refused at ``save()``. Files and directories are never group-
or world-writable.
"""

from __future__ import annotations

import logging
import os
import re
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any, cast

import torch

from ...integrity import ChecksumStream, IntegrityError, file_reader, make_dirs, open_new, seal, unseal
from ..base_state_dict import TensorAwareStateDict
from ..replication.strategies import ReplicationStrategy
from .base_manager import BaseCheckpointManager, CheckpointingException, CkptID, SameMachineReplicationException, Tag
from .part_globals import SAFE_GLOBALS, check_loadable, load_part

__all__ = ["SAFE_GLOBALS", "LocalCheckpointManager"]

logger = logging.getLogger(__name__)

_DIRTY = ".dirty"
_PART = re.compile(r"iter_(\d+)_(\d+)_(local|w\d+c[\d-]+)\.pt(\.dirty)?")


def _label(ckpt_id: CkptID) -> bytes:
    """What a part's trailer records of its id: (iteration, owner)."""
    return struct.pack("<II", ckpt_id[0] & 0xFFFFFFFF, ckpt_id[1])


def _write_parts(writes: list[tuple[str, bytes, TensorAwareStateDict]]) -> None:
    """Write each part, checksummed as it goes, to its (dirty) path and flush it to disk. The async function."""
    for path, label, part in writes:
        make_dirs(os.path.dirname(path))
        with open_new(path) as f:
            stream = ChecksumStream(f, read_back=file_reader(path))
            with stream.zip_records():  # each tensor's bytes hashed once, by torch (integrity module docstring)
                torch.save(part, cast(IO[bytes], stream))
            f.write(seal(stream.take(), stream.total, label))
            f.flush()
            os.fsync(f.fileno())
        logger.debug("wrote %s", path)


class LocalCheckpointManager(BaseCheckpointManager):
    """Local checkpoints in ``root_local_ckpt_dir`` (node-local storage such as an SSD or a RAM disk).

    Args:
        root_local_ckpt_dir: root directory; each rank uses ``<root>/<session_id>/<rank>``.
        session_id: separates the checkpoints of different workloads sharing a root (one path
            component, may be empty).
        repl_strategy: how parts are replicated (None: no replication).
    """

    def __init__(
        self, root_local_ckpt_dir: str | Path, session_id: str = "", repl_strategy: ReplicationStrategy | None = None
    ):
        if not isinstance(session_id, str) or session_id in (".", "..") or "/" in session_id or os.sep in session_id:
            raise ValueError(f"session_id must be one path component (or empty), got {session_id!r}")
        super().__init__(session_id, repl_strategy)
        self.root_local_ckpt_dir = root_local_ckpt_dir

    @property
    def local_ckpt_dir(self) -> Path:
        return Path(self.root_local_ckpt_dir) / self.session_id / str(self.rank)

    def _path(self, ckpt_id: CkptID, tag: Tag, dirty: bool = False) -> Path:
        iteration, owner, _ = ckpt_id
        name = f"iter_{iteration:07d}_{owner}_{tag or 'local'}.pt" + (_DIRTY if dirty else "")
        return self.local_ckpt_dir / name

    def _files(self) -> list[tuple[Path, CkptID, Tag, bool]]:
        """(path, id, tag, dirty) of every part file in this rank's directory (none if it is missing)."""
        directory = self.local_ckpt_dir
        if not directory.exists():
            return []
        found = []
        for entry in directory.iterdir():
            match = _PART.fullmatch(entry.name)
            if match and entry.is_file():
                tag = None if match[3] == "local" else match[3]
                found.append((entry, (int(match[1]), int(match[2]), self.session_id), tag, bool(match[4])))
        return found

    def _my_parts(self) -> list[tuple[CkptID, Tag]]:
        return [(ckpt_id, tag) for _, ckpt_id, tag, dirty in self._files() if not dirty]

    def _load(self, ckpt_id: CkptID, tag: Tag) -> TensorAwareStateDict:
        return load_part(self._intact_body(ckpt_id, tag), f"local checkpoint part {self._path(ckpt_id, tag)}")

    def _check_loadable(self, snapshot: TensorAwareStateDict) -> None:
        check_loadable(snapshot)

    def _intact_body(self, ckpt_id: CkptID, tag: Tag) -> memoryview:
        """The part's torch.save bytes, read once and checked against its trailer."""
        path = self._path(ckpt_id, tag)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise CheckpointingException(f"local checkpoint part {path} does not exist") from None
        try:
            return unseal(data, _label(ckpt_id), f"local checkpoint part {path}")
        except IntegrityError as exc:
            raise CheckpointingException(str(exc)) from None

    def _check_part(self, ckpt_id: CkptID, tag: Tag) -> None:
        self._intact_body(ckpt_id, tag)

    def _save_call(
        self, parts: dict[CkptID, TensorAwareStateDict], tag: Tag
    ) -> tuple[Callable[..., None], tuple[Any, ...]]:
        writes: dict[str, tuple[bytes, TensorAwareStateDict]] = {}
        for ckpt_id, part in parts.items():
            path = str(self._path(ckpt_id, tag, dirty=True))
            if path in writes:
                raise SameMachineReplicationException(ckpt_id)
            writes[path] = (_label(ckpt_id), part)
        return _write_parts, ([(path, label, part) for path, (label, part) in writes.items()],)

    def _publish(self, ckpt_ids: Sequence[CkptID], tag: Tag) -> None:
        for ckpt_id in ckpt_ids:
            dirty = self._path(ckpt_id, tag, dirty=True)
            if not dirty.is_file():
                raise CheckpointingException(f"part {ckpt_id} was not written: {dirty} is missing")
            os.replace(dirty, self._path(ckpt_id, tag))

    def _discard(self, iteration: int) -> None:
        self._remove(lambda i: i == iteration)

    def _cleanup(self, iteration: int) -> None:
        self._remove(lambda i: i != iteration)

    def _remove(self, which: Callable[[int], bool]) -> None:
        for path, (iteration, _, _), _, _ in self._files():
            if which(iteration):
                logger.debug("removing %s", path)
                path.unlink(missing_ok=True)
