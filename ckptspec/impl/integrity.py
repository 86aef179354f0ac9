"""Checksums, sealed files and safe file creation, shared by the DCP writer and the local managers.

* ``ChecksumStream`` wraps a binary stream being written and keeps a CRC32 of the bytes that pass through
  it, so a checksum costs no second pass over the data; ``take()`` returns the CRC32 since the last take.
  Inside ``zip_records()`` (a ``torch.save`` of a tensor) a tensor's payload is not hashed again: torch's zip
  writer has already computed its CRC32 and writes it in the record's data descriptor right after the payload,
  and ``crc32_combine`` joins it with the CRC32 of the bytes around it.
* ``seal`` / ``unseal``: a file body followed by a 28-byte trailer (magic, the body's length, its CRC32 and
  an 8-byte label such as the part's id), so that truncation, a flipped bit anywhere, or another file put in
  its place is detected before a single byte is interpreted. ``unseal`` raises ``IntegrityError``.
* ``open_new`` / ``make_dirs`` create files (0o644) and directories (0o755) with the user's umask applied on
  top: never group- or world-writable, whatever the umask (node-local storage such as /dev/shm is shared).

Decision: CRC32 (zlib, about 3 GB/s on one core, the GIL released) rather than SHA-256 (about 1 GB/s):
it detects every burst error up to 32 bits and random damage with probability 1 - 2**-32, which is what
storage damage needs; it is no defence against someone who can rewrite the checksum as well.
"""

from __future__ import annotations

import contextlib
import os
import struct
import zlib
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import IO, Any

__all__ = [
    "TRAILER_SIZE",
    "ChecksumStream",
    "IntegrityError",
    "crc32",
    "crc32_combine",
    "file_reader",
    "make_dirs",
    "open_new",
    "seal",
    "unseal",
]

FILE_MODE = 0o644
DIR_MODE = 0o755
_MAGIC = b"CKPTCRC1"
_TRAILER = struct.Struct("<8sQI8s")  # magic, body length, CRC32 of body + label, label
TRAILER_SIZE = _TRAILER.size


class IntegrityError(ValueError):
    """A checkpoint file does not match the checksum recorded when it was committed."""


def crc32(data: Any, value: int = 0) -> int:
    return zlib.crc32(data, value)


class ChecksumStream:
    """A write-only stream over ``stream`` that checksums what is written (CRC32; ``enabled=False``: none, ``take``
    gives 0, to measure what the checksum pass costs).

    A write of at least ``OVERLAP_BYTES`` (a tensor's data) is checksummed on a helper thread while this thread
    writes it: zlib and the file write both release the GIL, so the write costs the slower of the two, not their
    sum. The checksum is complete when ``write`` returns, so no buffer is read after its write. Writes smaller than
    ``GATHER_BELOW`` are gathered (copied) and reach ``stream`` together, at the latest at the next larger write,
    ``tell``, ``flush`` or ``take``: a caller that writes to ``stream`` itself calls ``take`` or ``flush`` first.

    ``read_back(offset, nbytes)``, when given, reads back bytes this stream wrote (counted from its first byte);
    with it, ``zip_records()`` hashes each byte once (module docstring). The descriptor is checked against the
    payload's length; a payload not followed by its descriptor is read back and hashed, so the result is the CRC32
    of the bytes written in every case.
    """

    def __init__(
        self,
        stream: IO[bytes],
        enabled: bool = True,
        read_back: Callable[[int, int], bytes] | None = None,
    ):
        self._stream = stream
        self._crc = 0
        self._total = 0
        self._enabled = enabled
        self._read_back = read_back
        self._zip = False
        self._pending: tuple[int, int, int] | None = None  # (CRC32 before the payload, its offset, its length)
        self._gathered = bytearray()  # small writes not yet passed on (written, hashed) to the stream

    @contextlib.contextmanager
    def zip_records(self) -> Iterator[None]:
        """Within: the writes are one ``torch.save`` whose zip writer computes CRC32s (module docstring)."""
        self._zip = self._enabled and self._read_back is not None and _torch_computes_crc32()
        try:
            yield
        finally:
            self._zip = False
            self._settle(None)

    def write(self, data: Any) -> int:
        # A write under GATHER_BELOW (torch's zip writer makes some 40 per tensor: headers, names, a small pickle) is
        # gathered and passed on with its neighbours, written and hashed in one call: a state dict of 10,000 small
        # tensors spent 0.5 s of its 2.2 s write in this method. Not while a payload's CRC32 awaits its descriptor.
        kind = type(data)
        if self._pending is None and (kind is bytes or (kind is memoryview and data.c_contiguous)):
            size = len(data) if kind is bytes else data.nbytes
            if size < GATHER_BELOW:
                self._gathered += data
                self._total += size
                if len(self._gathered) >= GATHER_BYTES:
                    self._pass_on_gathered()
                return size
        view = memoryview(data).cast("B")
        if self._pending is not None:
            self._settle(view)
        self._pass_on_gathered()  # the bytes before this one, first
        if not self._enabled:
            n = self._stream.write(view)
        elif view.nbytes < OVERLAP_BYTES:
            n = self._stream.write(view)
            self._crc = zlib.crc32(view, self._crc)
        elif self._zip:
            self._pending = (self._crc, self._total, view.nbytes)  # its CRC32 comes in the next write
            n = self._stream.write(view)
        else:
            checksum = _helper().submit(zlib.crc32, view, self._crc)
            try:
                n = self._stream.write(view)
            finally:
                crc = checksum.result()  # also when the write failed: the helper stops reading `view` first
            self._crc = crc
        self._total += view.nbytes
        return n

    def _pass_on_gathered(self) -> None:
        if self._gathered:
            self._stream.write(self._gathered)
            if self._enabled:
                self._crc = zlib.crc32(self._gathered, self._crc)
            self._gathered = bytearray()

    def _settle(self, descriptor: memoryview | None) -> None:
        """Account for the payload written last: by the CRC32 in ``descriptor``, if it is that payload's zip
        data descriptor, else by reading the payload back."""
        if self._pending is None:
            return
        before, offset, length = self._pending
        self._pending = None
        payload_crc = _descriptor_crc(descriptor, length) if descriptor is not None else None
        if payload_crc is None:
            assert self._read_back is not None  # a payload is left pending only with a way to read it back
            self._stream.flush()
            payload_crc = 0
            for start in range(offset, offset + length, READ_BACK_BYTES):
                chunk = self._read_back(start, min(READ_BACK_BYTES, offset + length - start))
                payload_crc = zlib.crc32(chunk, payload_crc)
        self._crc = crc32_combine(before, payload_crc, length)

    def tell(self) -> int:
        return self._stream.tell() + len(self._gathered)

    def flush(self) -> None:
        self._pass_on_gathered()
        self._stream.flush()

    @property
    def total(self) -> int:
        """Bytes written through this stream."""
        return self._total

    def take(self) -> int:
        """The CRC32 of the bytes written since the previous take (or the start); every byte written so far is in
        the stream when it returns."""
        self._settle(None)
        self._pass_on_gathered()
        value, self._crc = self._crc, 0
        return value


READ_BACK_BYTES = 64 << 20
_DESCRIPTOR = struct.Struct("<4sIII")  # signature, CRC32, compressed and uncompressed size
_DESCRIPTOR64 = struct.Struct("<4sIQQ")  # the same with ZIP64 sizes
_DESCRIPTOR_SIGNATURE = b"PK\x07\x08"


def _descriptor_crc(view: memoryview, length: int) -> int | None:
    """The CRC32 in ``view`` if it is the zip data descriptor of a stored payload of ``length`` bytes."""
    for layout in (_DESCRIPTOR, _DESCRIPTOR64):
        if view.nbytes == layout.size:
            signature, crc, compressed, uncompressed = layout.unpack(view)
            mask = (1 << (8 * (layout.size - 8) // 2)) - 1  # a 4-byte size field holds the length modulo 2**32
            if signature == _DESCRIPTOR_SIGNATURE and compressed == uncompressed == length & mask:
                return int(crc)
    return None


def _torch_computes_crc32() -> bool:
    """Whether ``torch.save`` writes a CRC32 of each record (torch's serialization config; False where unknown)."""
    try:
        from torch.utils.serialization import config
    except ImportError:
        return False
    return bool(getattr(getattr(config, "save", None), "compute_crc32", False))


_CRC_POLY = 0xEDB88320  # CRC-32 (zlib's), reflected


def _multmodp(a: int, b: int) -> int:
    """a * b modulo the CRC-32 polynomial (reflected bit order), as zlib's crc32_combine computes it."""
    m, p = 1 << 31, 0
    while True:
        if a & m:
            p ^= b
            if (a & (m - 1)) == 0:
                return p
        m >>= 1
        b = (b >> 1) ^ _CRC_POLY if b & 1 else b >> 1


def _x2n_table() -> list[int]:
    table, p = [], 1 << 30  # x**1
    for _ in range(32):
        table.append(p)
        p = _multmodp(p, p)
    return table


_X2N = _x2n_table()  # x**(2**k) modulo the polynomial


def crc32_combine(crc1: int, crc2: int, len2: int) -> int:
    """The CRC32 of A + B from crc1 = CRC32(A), crc2 = CRC32(B) and len2 = len(B) (zlib's crc32_combine)."""
    p, k, n = 1 << 31, 3, len2  # x**0, times x**(8 * len2)
    while n:
        if n & 1:
            p = _multmodp(_X2N[k & 31], p)
        n >>= 1
        k += 1
    return _multmodp(p, crc1) ^ crc2


OVERLAP_BYTES = 1 << 20
GATHER_BELOW = 64 << 10  # ChecksumStream gathers the writes smaller than this ...
GATHER_BYTES = 1 << 20  # ... and passes them on once they hold this much (or at a larger write, tell, flush, take)
_helper_pool: tuple[int, ThreadPoolExecutor] | None = None


def _helper() -> ThreadPoolExecutor:
    """This process's checksum threads (made again in a forked child, where the parent's threads do not exist)."""
    global _helper_pool
    if _helper_pool is None or _helper_pool[0] != os.getpid():
        _helper_pool = (os.getpid(), ThreadPoolExecutor(max_workers=4, thread_name_prefix="ckpt-crc"))
    return _helper_pool[1]


def seal(body_crc: int, body_length: int, label: bytes) -> bytes:
    """The trailer to write after a body of ``body_length`` bytes whose CRC32 is ``body_crc``."""
    label = label.ljust(8, b"\0")[:8]
    return _TRAILER.pack(_MAGIC, body_length, zlib.crc32(label, body_crc), label)


def unseal(data: bytes | memoryview, label: bytes, what: str) -> memoryview:
    """The body of sealed ``data``; IntegrityError (naming ``what``) unless it is intact and carries ``label``."""
    view = memoryview(data)
    if len(view) < TRAILER_SIZE:
        raise IntegrityError(f"{what} is damaged: {len(view)} bytes, too short for its checksum trailer")
    magic, length, value, stored_label = _TRAILER.unpack(view[-TRAILER_SIZE:])
    body = view[:-TRAILER_SIZE]
    if magic != _MAGIC or length != len(body):
        raise IntegrityError(f"{what} is damaged: truncated or extended (no valid checksum trailer at its end)")
    if zlib.crc32(stored_label, zlib.crc32(body)) != value:
        raise IntegrityError(f"{what} is damaged: its CRC32 does not match the one recorded when it was saved")
    if stored_label != label.ljust(8, b"\0")[:8]:
        raise IntegrityError(f"{what} holds another checkpoint's data (recorded as {stored_label!r}, not {label!r})")
    return body


def file_reader(path: str | os.PathLike[str]) -> Callable[[int, int], bytes]:
    """``read(offset, nbytes)``: those bytes of the file at ``path`` (also while it is being written, once flushed);
    OSError if fewer are there."""

    def read(offset: int, nbytes: int) -> bytes:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
        try:
            data = os.pread(fd, nbytes, offset)
        finally:
            os.close(fd)
        if len(data) != nbytes:
            raise OSError(f"{os.fspath(path)}: read {len(data)} of the {nbytes} bytes written at offset {offset}")
        return data

    return read


def open_new(path: str | os.PathLike[str]) -> IO[bytes]:
    """Open ``path`` for writing (created or truncated), mode 0o644 less the umask.

    Through ``open`` (with an opener that sets the mode), not ``os.fdopen``: tools that trace or inject faults at
    Python's file entry points (the conformance suite's ``faultfs``) see every write of the file.
    """
    return open(path, "wb", opener=_open_with_file_mode)


_os_open = os.open  # the opener's own call, taken at import: the open is traced once, as open(), not twice


def _open_with_file_mode(path: str, flags: int) -> int:
    return _os_open(path, flags | getattr(os, "O_CLOEXEC", 0), FILE_MODE)


def make_dirs(path: str | os.PathLike[str]) -> None:
    """``os.makedirs(path, exist_ok=True)``, but every directory it creates gets mode 0o755 less the umask.

    (``os.makedirs`` gives intermediate directories 0o777 less the umask.)
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        return
    parent = os.path.dirname(os.path.abspath(path))
    if parent != path:
        make_dirs(parent)
    try:
        os.mkdir(path, DIR_MODE)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
