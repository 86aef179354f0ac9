"""The processes a benchmark measures: one side per saver, started, asked to save, counted and reaped.

A side (ckptspec/bench/side.py, run by path) owns one saver in a process of its own: this checkout's interpreter,
another interpreter (an installed release), or a commit of a git checkout unpacked first on its PYTHONPATH
(`side_spec`). `Side` starts one, bounds every answer (REQUEST_TIMEOUT_S; a side that does not answer is named with
its last lines of stderr) and always ends its whole process group. `count_saves` runs a side under strace and
counts, per steady save, the system calls of its process tree by group (SYSCALLS) and the files and bytes of its
checkpoint: numbers that do not move between runs of the same code. `machine` says where the rounds ran.
`device` ("cpu" or "cuda", side.py's `--device`) is where every side's tensors live; `device_problem` is the
driver's own check of it, so that `--device cuda` on a machine without a GPU stops before any side starts.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import re
import selectors
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

__all__ = [
    "COUNTED_SAVES",
    "DEVICES",
    "MARK",
    "SYSCALLS",
    "GateError",
    "Side",
    "SideSpec",
    "count_saves",
    "device_problem",
    "from_commit",
    "machine",
    "per_request",
    "scratch_dir",
    "side_spec",
    "started",
]

SIDE = Path(__file__).with_name("side.py")
DEVICES = ("cpu", "cuda")
COUNTED_SAVES = 2
REQUEST_TIMEOUT_S = 300.0
SYSCALLS = {
    "fsync": ("fsync", "fdatasync", "sync_file_range", "syncfs", "sync"),
    "rename": ("rename", "renameat", "renameat2"),
    "mkdir": ("mkdir", "mkdirat"),
    "unlink": ("unlink", "unlinkat", "rmdir"),
    "write": ("write", "pwrite64", "writev", "pwritev", "pwritev2"),
}


class GateError(Exception):
    """The comparison could not be made (a side failed to start or answer); str() says which side and why."""


def device_problem(device: str, world: int = 1) -> str | None:
    """Why the sides cannot put `world` ranks' tensors on `device` here (cuda: one GPU per rank), or None. Checked
    with this interpreter's torch; without torch here the sides' own check (side.py) answers instead."""
    if device not in DEVICES:
        return f"--device {device!r}: one of {', '.join(DEVICES)}"
    if device == "cpu":
        return None
    try:
        import torch  # noqa: F401
    except ImportError:
        return None
    return _side_module().device_problem(device, world)  # the sides' own check, written once (side.py)


@functools.cache
def _side_module() -> ModuleType:
    """side.py as a module (it is run by path, so the driver loads it by path too)."""
    spec = importlib.util.spec_from_file_location("ckptspec_bench_side", SIDE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class SideSpec:
    """How to start one side: the interpreter, what goes first on its PYTHONPATH, the adapter it measures."""

    label: str
    python: str
    impl: str
    pythonpath: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()

    def environ(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
        env.update(self.env)
        if self.pythonpath:
            env["PYTHONPATH"] = os.pathsep.join([*self.pythonpath, env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        return env


def side_spec(
    label: str, ref: str | None, impl: str, repo: Path, unpack_to: Path, env: dict[str, str] | None = None
) -> SideSpec:
    """The side for `ref`: None is this interpreter and checkout; a path to an executable is that interpreter;
    anything else a commit of `repo`, unpacked under `unpack_to`. `env`: variables set for this side only."""
    extra = tuple(sorted((env or {}).items()))
    if ref is None:
        return SideSpec(label, sys.executable, impl, env=extra)
    if os.path.isfile(ref) and os.access(ref, os.X_OK):
        return SideSpec(label, os.path.abspath(ref), impl, env=extra)
    return SideSpec(label, sys.executable, impl, (str(from_commit(repo, ref, unpack_to)),), extra)


def from_commit(repo: Path, ref: str, unpack_to: Path) -> Path:
    """The tree of commit `ref` of the git checkout `repo`, unpacked into `unpack_to`; GateError if it is none."""
    resolved = subprocess.run(
        ["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"],
        capture_output=True,
        text=True,
        check=False,
    )
    if resolved.returncode != 0:
        raise GateError(f"--against {ref!r} is neither an executable nor a commit of the git checkout {repo}")
    archive = unpack_to / "tree.tar"
    with archive.open("wb") as sink:
        made = subprocess.run(["git", "-C", str(repo), "archive", resolved.stdout.strip()], stdout=sink, check=False)
    if made.returncode != 0:
        raise GateError(f"git archive of {ref} in {repo} failed (exit status {made.returncode})")
    tree = unpack_to / "tree"
    with tarfile.open(archive) as tar:
        tar.extractall(tree, filter="data")
    archive.unlink()
    return tree


class Side:
    """A running side process (see side.py's protocol); `request` bounds every answer by `timeout` seconds."""

    def __init__(
        self,
        spec: SideSpec,
        scratch: Path,
        size_mib: float,
        tensors: int,
        wrap: list[str] | None = None,
        world: int = 1,
        threads: int = 1,
        device: str = "cpu",
        wait: bool = True,
        phases: bool = False,
    ):
        """Start the side; with `wait` (default) return once it is ready, else the caller calls await_ready() (so
        that several sides start at once)."""
        self.spec = spec
        scratch.mkdir(parents=True, exist_ok=True)
        self.scratch = scratch
        self._stderr = (scratch / "stderr.log").open("wb")
        command = [
            spec.python,
            str(SIDE),
            "--impl",
            spec.impl,
            "--scratch",
            str(scratch),
            "--size-mib",
            f"{size_mib:g}",
            "--tensors",
            str(tensors),
            "--world",
            str(world),
            "--threads",
            str(threads),
            *(("--device", device) if device != "cpu" else ()),  # a side of an older checkout knows no --device
            *(("--phases",) if phases else ()),  # impl's phase marks: timing only (they are writes a count would see)
        ]
        self.process = subprocess.Popen(
            [*(wrap or []), *command],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            env=spec.environ(),
            start_new_session=True,  # its own process group: the driver ends the side and every worker it started
        )
        self._buffer = b""
        self.ready: dict = {}
        if wait:
            self.await_ready()

    def await_ready(self) -> dict:
        """The side's first reply (side.py: ready, its target and version); GateError if it cannot start, the side
        then ended and reaped."""
        try:
            self.ready = self._read("start", REQUEST_TIMEOUT_S)
        except GateError:
            self.close()
            raise
        return self.ready

    def request(self, message: dict, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        assert self.process.stdin is not None
        try:
            self.process.stdin.write((json.dumps(message) + "\n").encode())
            self.process.stdin.flush()
        except BrokenPipeError:
            raise GateError(self._failure(f"{message['op']}: the side has exited")) from None
        return self._read(message["op"], timeout)

    def _read(self, what: str, timeout: float) -> dict:
        assert self.process.stdout is not None
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self.process.stdout, selectors.EVENT_READ)
            while b"\n" not in self._buffer:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise GateError(self._failure(f"no answer to {what} within {timeout:g} s"))
                chunk = os.read(self.process.stdout.fileno(), 1 << 16)
                if not chunk:
                    raise GateError(self._failure(f"{what}: the side exited ({self.process.wait(5)})"))
                self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        answer = json.loads(line)
        if "error" in answer:
            raise GateError(self._failure(f"{what}: {answer['error']}"))
        return answer

    def _failure(self, why: str) -> str:
        self._stderr.flush()
        tail = (self.scratch / "stderr.log").read_text(errors="replace").strip().splitlines()[-15:]
        return f"side {self.spec.label} ({self.spec.impl}, {self.spec.python}): {why}" + "".join(
            f"\n  | {line}" for line in tail
        )

    def close(self) -> None:
        """Close the saver (bounded), then end the side's process group; always reaps."""
        try:
            if self.process.poll() is None:
                self.request({"op": "close"}, timeout=120)
                self.process.wait(timeout=60)
        except (GateError, subprocess.TimeoutExpired):
            pass
        finally:
            if self.process.poll() is None:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
            for pipe in (self.process.stdin, self.process.stdout):
                if pipe is not None:
                    pipe.close()
            self._stderr.close()


@contextmanager
def started(
    specs: list[SideSpec], scratch: Path, size_mib: float, tensors: int, world: int = 1, device: str = "cpu"
) -> Iterator[list[Side]]:
    """Every side of `specs` started (each in scratch/<label>), closed and reaped on the way out."""
    running: list[Side] = []
    try:
        for spec in specs:  # one by one: a side that fails to start still has the others closed
            running.append(Side(spec, scratch / spec.label, size_mib, tensors, world=world, device=device))  # noqa: PERF401
        yield running
    finally:
        for side in running:
            side.close()


def machine() -> dict:
    """Where the rounds ran: CPU model, cores, memory, Python, the time (the sides report their torch)."""
    model, memory = "?", 0
    try:
        model = next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            "?",
        )
        memory = next(
            int(line.split()[1]) * 1024
            for line in Path("/proc/meminfo").read_text().splitlines()
            if line.startswith("MemTotal")
        )
    except (OSError, StopIteration, ValueError):
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "memory_gib": round(memory / (1 << 30), 1),
        "python": sys.version.split()[0],
        "datetime": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


MARK = "/ckptspec-side-mark-"
_CALL = re.compile(r"^(?:\d+\s+)?(\w+)\(")


def per_request(trace: str) -> list[dict[str, int]]:
    """strace -f's lines split at the side's marks (side.py): the system calls each request made, by name.
    A call interrupted by another thread's line counts once, at its start (the "resumed" line is not a call)."""
    segments: list[dict[str, int]] = []
    for line in trace.splitlines():
        if MARK in line:
            segments.append({})
            continue
        match = _CALL.match(line)
        if match and segments:
            segments[-1][match.group(1)] = segments[-1].get(match.group(1), 0) + 1
    return segments


def _counted_run(
    spec: SideSpec, saves: int, size_mib: float, tensors: int, scratch: Path, device: str = "cpu"
) -> tuple[list, dict]:
    out = scratch / "strace.txt"
    traced = sorted({name for names in SYSCALLS.values() for name in names} | {"access", "faccessat", "faccessat2"})
    wrap = ["strace", "-f", "-qq", "-o", str(out), "-e", "trace=" + ",".join(traced)]
    side = Side(spec, scratch, size_mib, tensors, wrap=wrap, device=device)
    on_disk: dict[str, int] = {}
    try:
        for i in range(saves):
            path = scratch / f"save-{i}"
            side.request({"op": "save", "path": str(path), "verify": False})
            files = [p for p in path.rglob("*") if p.is_file()]
            on_disk = {"files": len(files), "bytes": sum(p.stat().st_size for p in files)}
            shutil.rmtree(path, ignore_errors=True)
    finally:
        side.close()
    segments = per_request(out.read_text())[:saves]
    if len(segments) < saves:
        raise GateError(f"side {spec.label}: the trace holds {len(segments)} of {saves} saves' marks")
    return segments, on_disk


def count_saves(spec: SideSpec, size_mib: float, tensors: int, scratch: Path, device: str = "cpu") -> dict[str, float]:
    """Per steady save of `spec`'s saver (the mean over COUNTED_SAVES saves after the first): system calls by group
    (SYSCALLS) of the side's whole process tree, and the files and bytes its checkpoint holds. Needs strace;
    GateError without it."""
    if shutil.which("strace") is None:
        raise GateError("counted costs need strace (apt-get install strace); not measured")
    segments, on_disk = _counted_run(spec, 1 + COUNTED_SAVES, size_mib, tensors, scratch, device)
    steady = segments[1:]
    counted: dict[str, float] = {
        group: sum(seg.get(n, 0) for seg in steady for n in names) / len(steady) for group, names in SYSCALLS.items()
    }
    counted.update(on_disk)
    return counted


@contextmanager
def scratch_dir() -> Iterator[Path]:
    """A temporary directory of the comparison's own, removed by exact path afterwards."""
    path = Path(tempfile.mkdtemp(prefix="ckptspec-paired-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
