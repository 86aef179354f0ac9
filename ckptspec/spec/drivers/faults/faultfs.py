"""An injected file-system layer: trace the persistence points of a save and inject a fault at one.

Installed in a process (`installed(plan)`), and inherited by the processes it forks, the layer wraps
the Python entry points through which checkpoint writers change files below one directory, the
plan's `root`:

    open for writing (builtins.open, io.open, pathlib, os.open), every write() to a file so opened
    (and os.write/os.pwrite to a descriptor below root), os.fsync/os.fdatasync, os.rename/os.replace,
    os.mkdir, os.unlink/os.remove, os.rmdir, os.truncate/os.ftruncate

Each such call is a *persistence point* (CrashMonkey/ALICE's unit). Points are numbered across every
process of one save through an append-only log of fixed-size records written under an exclusive
`flock`, so the numbering is a total order even with concurrent writer processes. The log is also
the trace a test reads afterwards (`read_log`).

A `Fault` names the point at which to act, either by its global index (`at`) or as the `nth` point
matching an operation kind and a file-name pattern, and the action:

- "raise": the call raises OSError(errno) instead of running (EACCES on open, ENOSPC on write, ...);
  `limit` turns "write" into a size-limited file system: a write that would take the bytes written
  below root past `limit` raises ENOSPC.
- "crash": the call runs, then every process of the save's session is SIGKILLed (the caller last).
  A process that reaches a later point while the crash is under way kills itself before running it.
- "hang": the call never returns (a file system that stops answering) unless `gate` appears.
- "die": the calling process SIGKILLs itself before running the call.

Processes started with the spawn method do not inherit the layer: a test that finds its fault never
fired (`fired`) cannot conclude anything and says so.
"""

from __future__ import annotations

import builtins
import contextlib
import dataclasses
import errno as errno_codes
import fcntl
import fnmatch
import io
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["Fault", "Plan", "Point", "errno_of", "fired", "installed", "read_log"]

_RECORD = 256  # bytes per log record
_OPS = ("open", "write", "fsync", "rename", "mkdir", "unlink", "rmdir", "truncate")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_HANG_LIMIT = 300.0  # a hung call gives up after this long, so a forgotten process cannot live forever


@dataclasses.dataclass(frozen=True)
class Fault:
    """Where to act and what to do (see the module docstring)."""

    action: str
    at: int | None = None
    op: str | None = None
    name: str = "*"
    nth: int = 1
    errno: int = 0
    limit: int | None = None
    gate: str | None = None
    in_child: bool = False

    def __post_init__(self) -> None:
        if self.action not in ("raise", "crash", "hang", "die"):
            raise ValueError(f"unknown fault action {self.action!r}")
        if self.op is not None and self.op not in _OPS:
            raise ValueError(f"unknown operation {self.op!r}; one of {', '.join(_OPS)}")
        if self.action == "raise" and not self.errno:
            raise ValueError("a 'raise' fault needs an errno")
        if self.at is not None and (self.op is not None or self.limit is not None):
            raise ValueError("a fault is placed either by index (at) or by op/name/nth/limit")


@dataclasses.dataclass(frozen=True)
class Plan:
    """The layer's configuration: the directory it watches, its log, and the faults (may be none)."""

    root: str
    log: str
    faults: tuple[Fault, ...] = ()


@dataclasses.dataclass(frozen=True)
class Point:
    """One log record: index, process, operation, path relative to root, bytes, and what happened."""

    index: int
    pid: int
    op: str
    path: str
    nbytes: int
    outcome: str  # "ok" | "raise" | "crash" | "hang" | "die" | "killed"


def read_log(log: str) -> list[Point]:
    """The points recorded so far (a torn last record, from a kill mid-append, is dropped)."""
    if not os.path.exists(log):
        return []
    with open(log, "rb") as f:
        data = f.read()
    points = []
    for i in range(len(data) // _RECORD):
        fields = data[i * _RECORD : (i + 1) * _RECORD].rstrip(b" \n").decode().split("\t")
        if len(fields) == 6:
            points.append(Point(int(fields[0]), int(fields[1]), fields[2], fields[3], int(fields[4]), fields[5]))
    return points


def fired(log: str, outcome: str) -> list[Point]:
    """The points at which the layer took the action `outcome` ("raise", "crash", ...)."""
    return [p for p in read_log(log) if p.outcome == outcome]


# ------------------------------------------------------------------------------------ the layer

_real: dict[str, Callable[..., Any]] = {
    "open": builtins.open,
    "os.open": os.open,
    "os.write": os.write,
    "os.pwrite": os.pwrite,
    "os.fsync": os.fsync,
    "os.fdatasync": os.fdatasync,
    "os.rename": os.rename,
    "os.replace": os.replace,
    "os.mkdir": os.mkdir,
    "os.unlink": os.unlink,
    "os.remove": os.remove,
    "os.rmdir": os.rmdir,
    "os.truncate": os.truncate,
    "os.ftruncate": os.ftruncate,
}
_state = threading.local()  # .busy: inside the layer (its own file operations are not points)


class _Layer:
    def __init__(self, plan: Plan):
        self.plan = plan
        self.root = os.path.realpath(plan.root)
        self.installer = os.getpid()

    # -------------------------------------------------------------------------- classification

    def below_root(self, path: Any) -> str | None:
        """path relative to root if it lies below root, else None. `path` may be a descriptor, or an object with
        fileno() (os.fsync and os.fdatasync accept an open file: OLMo-core's writers pass one)."""
        if not isinstance(path, (int, str, bytes, os.PathLike)) and hasattr(path, "fileno"):
            try:
                path = path.fileno()
            except (OSError, ValueError):
                return None
        if isinstance(path, int):
            try:
                path = os.readlink(f"/proc/self/fd/{path}")
            except OSError:
                return None
        try:
            full = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return None
        if full == self.root or full.startswith(self.root + os.sep):
            return os.path.relpath(full, self.root)
        return None

    # -------------------------------------------------------------------------------- the log

    def point(self, op: str, rel: str, nbytes: int = 0) -> tuple[str, Fault | None]:
        """Number this point, decide what happens, log it; return (outcome, fault)."""
        _state.busy = True
        try:
            fd = _real["os.open"](self.plan.log, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)
                previous = read_log(self.plan.log)
                index = len(previous)
                crashing = any(p.outcome == "crash" for p in previous)
                fault = None if crashing else self._decide(index, op, rel, nbytes, previous)
                outcome = "killed" if crashing else (fault.action if fault else "ok")
                line = "\t".join(map(str, (index, os.getpid(), op, rel, nbytes, outcome)))
                _real["os.write"](fd, line.encode().ljust(_RECORD - 1)[: _RECORD - 1] + b"\n")
            finally:
                os.close(fd)
        finally:
            _state.busy = False
        return outcome, fault

    def _decide(self, index: int, op: str, rel: str, nbytes: int, previous: list[Point]) -> Fault | None:
        for fault in self.plan.faults:
            if fault.in_child and os.getpid() == self.installer:
                continue
            if fault.at is not None:
                if index == fault.at:
                    return fault
                continue
            if fault.op is not None and op != fault.op:
                continue
            if not fnmatch.fnmatch(os.path.basename(rel), fault.name):
                continue
            if fault.limit is not None:
                written = sum(p.nbytes for p in previous if p.op == "write" and p.outcome == "ok")
                if written + nbytes > fault.limit:
                    return fault
                continue
            earlier = sum(1 for p in previous if p.op == op and fnmatch.fnmatch(os.path.basename(p.path), fault.name))
            if earlier + 1 == fault.nth:
                return fault
        return None

    # ------------------------------------------------------------------------------ the actions

    def around(self, op: str, rel: str | None, call: Callable[[], Any], nbytes: int = 0) -> Any:
        """Run call() as persistence point (op, rel), acting as the plan says."""
        if rel is None or getattr(_state, "busy", False):
            return call()
        outcome, fault = self.point(op, rel, nbytes)
        if outcome in ("killed", "die"):
            os.kill(os.getpid(), signal.SIGKILL)
        if outcome == "raise":
            assert fault is not None  # an action other than ok/killed comes from a fault
            raise OSError(fault.errno, f"{os.strerror(fault.errno)} (injected on {op})", os.path.join(self.root, rel))
        if outcome == "hang":
            assert fault is not None
            deadline = time.monotonic() + _HANG_LIMIT
            while time.monotonic() < deadline and not (fault.gate and os.path.exists(fault.gate)):
                time.sleep(0.01)
        result = call()
        if outcome == "crash":
            _kill_session()
        return result


def _kill_session() -> None:
    """SIGKILL every process of this session, this one last: the whole save stops at once."""
    me, sid = os.getpid(), os.getsid(0)
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        try:
            with builtins.open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            if int(fields[3]) == sid:  # field 6 of stat: session id
                os.kill(int(entry), signal.SIGKILL)
        except (OSError, IndexError, ValueError):
            continue
    os.kill(me, signal.SIGKILL)


class _TracedFile:
    """A file opened for writing below root: every write() is a point; everything else passes."""

    def __init__(self, layer: _Layer, raw: Any, rel: str) -> None:
        self._layer, self._raw, self._rel = layer, raw, rel

    def write(self, data: Any) -> Any:
        size = memoryview(data).nbytes if not isinstance(data, str) else len(data.encode())
        return self._layer.around("write", self._rel, lambda: self._raw.write(data), size)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __enter__(self) -> _TracedFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self._raw.close()

    def __iter__(self) -> Any:
        return iter(self._raw)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def _patched(layer: _Layer) -> dict[str, Callable[..., Any]]:
    """The replacement for each wrapped entry point."""

    def traced_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
        raw_open = _real["open"]
        rel = layer.below_root(file) if isinstance(file, (str, bytes, os.PathLike)) else None
        if rel is None or not any(c in mode for c in "wax+"):
            return raw_open(file, mode, *args, **kwargs)
        raw = layer.around("open", rel, lambda: raw_open(file, mode, *args, **kwargs))
        return _TracedFile(layer, raw, rel)

    def traced_os_open(path: Any, flags: int, mode: int = 0o777, *, dir_fd: int | None = None) -> Any:
        rel = layer.below_root(path) if dir_fd is None and flags & _WRITE_FLAGS else None
        return layer.around("open", rel, lambda: _real["os.open"](path, flags, mode, dir_fd=dir_fd))

    def fd_call(op: str, name: str, nbytes: Callable[..., int] = lambda *a: 0) -> Callable[..., Any]:
        def call(fd: int, *args: Any) -> Any:
            return layer.around(op, layer.below_root(fd), lambda: _real[name](fd, *args), nbytes(fd, *args))

        return call

    def path_call(op: str, name: str) -> Callable[..., Any]:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            return layer.around(op, layer.below_root(path), lambda: _real[name](path, *args, **kwargs))

        return call

    def rename_call(name: str) -> Callable[..., Any]:
        def call(src: Any, dst: Any, *args: Any, **kwargs: Any) -> Any:
            rel = layer.below_root(src) or layer.below_root(dst)
            shown = None if rel is None else f"{layer.below_root(src)}->{layer.below_root(dst)}"
            return layer.around("rename", shown, lambda: _real[name](src, dst, *args, **kwargs))

        return call

    def truncate(path: Any, length: int) -> Any:
        return layer.around("truncate", layer.below_root(path), lambda: _real["os.truncate"](path, length))

    return {
        "open": traced_open,
        "os.open": traced_os_open,
        "os.write": fd_call("write", "os.write", lambda fd, data: len(data)),
        "os.pwrite": fd_call("write", "os.pwrite", lambda fd, data, offset: len(data)),
        "os.fsync": fd_call("fsync", "os.fsync"),
        "os.fdatasync": fd_call("fsync", "os.fdatasync"),
        "os.rename": rename_call("os.rename"),
        "os.replace": rename_call("os.replace"),
        "os.mkdir": path_call("mkdir", "os.mkdir"),
        "os.unlink": path_call("unlink", "os.unlink"),
        "os.remove": path_call("unlink", "os.remove"),
        "os.rmdir": path_call("rmdir", "os.rmdir"),
        "os.truncate": truncate,
        "os.ftruncate": fd_call("truncate", "os.ftruncate"),
    }


def _bind(table: dict[str, Callable[..., Any]]) -> None:
    builtins.open = io.open = table["open"]
    for name, fn in table.items():
        if name.startswith("os."):
            setattr(os, name[3:], fn)


_installed: list[_Layer] = []


@contextlib.contextmanager
def installed(plan: Plan | None) -> Iterator[_Layer | None]:
    """Wrap this process's file operations below plan.root while the block runs (None: no-op)."""
    if plan is None:
        yield None
        return
    if _installed:
        raise RuntimeError("the fault layer is already installed in this process")
    layer = _Layer(plan)
    _installed.append(layer)
    _bind(_patched(layer))
    try:
        yield layer
    finally:
        _bind(_real)
        _installed.clear()


def errno_of(name: str) -> int:
    """errno.ENOSPC for "ENOSPC" (bad names get a clear error)."""
    try:
        return int(getattr(errno_codes, name))
    except AttributeError:
        raise ValueError(f"unknown errno name {name!r}") from None
