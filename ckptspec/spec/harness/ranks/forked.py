"""The forked runner (`ForkedRunner`, the default Runner): a test body on N ranks forked here, with a bound on
every run and a report that covers every rank; fresh ranks for one run, or a pool's warm ranks kept between runs.

Ranks are forked from a forkserver that has torch and the target preloaded (tens of ms per rank
instead of seconds), rendezvous through a FileStore in a temporary directory (no ports, so xdist
workers never collide), and use gloo, or NCCL when `backend="nccl"` (or "auto" in a run whose trainer
tensors live on the GPU, `--tensor-device cuda`, with a GPU per rank; too few GPUs skip before anything is
started). Each rank is the leader of its own session (and so of its
process group), so stopping a rank with `killpg` also ends every process it started, orphans included, and a
process that left the group with setpgid is still found in the session.

A run fails with one `RankFailures` listing every rank: its traceback, its unexpected exit code,
or, for a rank that did not finish within the timeout (or within a short grace period after another
rank failed), its stack dumped by faulthandler. `expect_exit={rank: code}` declares a death the test
causes on purpose (e.g. `-signal.SIGKILL`). A rank that calls `pytest.skip` skips the test.
What tests call (`ranks`, `run_on_ranks`, `RankPool`) and the choice of runner (`use_runner`) are
ckptspec.spec.harness.ranks.seam's; the vocabulary of a run is ckptspec.spec.harness.ranks.vocabulary's.
"""

from __future__ import annotations

import contextlib
import faulthandler
import importlib
import multiprocessing as mp
import os
import shutil
import signal
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from multiprocessing.context import ForkServerContext
from multiprocessing.process import BaseProcess
from typing import IO, Any

from ckptspec.spec.harness.ranks.fork_safety import cuda_survives_fork
from ckptspec.spec.harness.ranks.vocabulary import (
    DUMP_WAIT,
    GRACE_AFTER_FAILURE,
    Job,
    RankOutcome,
    finish,
    job_of,
)

__all__ = ["FORKED", "ForkedRunner", "GpuWaitTimeout"]


def _forked_backend(backend: str, world_size: int) -> str:
    """ "gloo", or "nccl" when asked for (or "auto" with CUDA trainer tensors) and world_size GPUs exist; else skip.

    "auto" is gloo for a run with CPU tensors even on a GPU node: NCCL ranks take a GPU each, exclusively
    (_GpuLease), so every test of a run would queue for the node's GPUs (the H100 run of 2026-11-27: 1-rank tests
    of `pytest -n auto` waited up to 90 s for the one GPU, and 8 of them failed on that wait).
    """
    import pytest
    import torch

    from ckptspec.spec.harness.ranks import devices

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if backend == "auto":
        return "nccl" if devices.current() == "cuda" and gpus >= world_size else "gloo"
    if backend == "nccl" and gpus < world_size:
        pytest.skip(f"needs {world_size} CUDA devices for NCCL, found {gpus}")
    return backend


# --------------------------------------------------------------------------------------- ranks


@dataclass(frozen=True)
class _WorldSpec:
    world_size: int
    backend: str
    store_path: str
    dump_dir: str
    target_name: str
    pg_timeout: float
    devices: tuple[int, ...] = ()  # NCCL: the GPU of each rank, leased by _GpuLease


def _rank_main(rank: int, spec: _WorldSpec, conn: Connection, job: Job | None) -> None:
    try:
        _join_world(rank, spec)
    except BaseException:
        conn.send(("error", f"rank setup failed:\n{traceback.format_exc()}"))
        return
    while job is not None:
        _serve(conn, job)
        job = conn.recv()  # one-shot runs and RankPool.close send None
    import torch.distributed as dist

    if dist.is_initialized():  # a test may have destroyed it on purpose
        dist.destroy_process_group()


def _join_world(rank: int, spec: _WorldSpec) -> None:
    # A session, not only a group: a worker that leaves its rank's group (setpgid, as impl's does) stays in the
    # rank's session, where the P-EXIT tests look for what outlived the rank.
    os.setsid()
    from ckptspec.spec.harness.ranks.reaper import MARK

    os.environ.update(RANK=str(rank), WORLD_SIZE=str(spec.world_size), LOCAL_RANK=str(rank), **{MARK: spec.dump_dir})
    from ckptspec.spec.harness.surface.loading import ENV_VAR, load_target

    os.environ[ENV_VAR] = spec.target_name
    # Left open for the process's lifetime: faulthandler writes the stacks to it on SIGUSR1.
    dump = open(os.path.join(spec.dump_dir, f"rank{rank}.stack"), "w")  # noqa: SIM115
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True)
    import torch
    import torch.distributed as dist

    target = load_target(spec.target_name)
    if spec.backend == "nccl":
        torch.cuda.set_device(spec.devices[rank])
    dist.init_process_group(
        target.backend(spec.backend),
        store=dist.FileStore(spec.store_path, spec.world_size),
        rank=rank,
        world_size=spec.world_size,
        timeout=timedelta(seconds=spec.pg_timeout),
    )
    # gloo's init can return on one rank while a peer is still connecting; a rank that then
    # finishes (or dies) first would break that peer's setup. Start the body only when all joined.
    dist.barrier()


def _serve(conn: Connection, job: Job) -> None:
    import pytest

    from ckptspec.spec.harness.surface.loading import MissingCapability

    module, qualname, unwrap, args, kwargs = job
    reply: tuple[str, Any]
    try:
        fn: Any = importlib.import_module(module)
        for part in qualname.split("."):
            fn = getattr(fn, part)
        result = (fn.__wrapped__ if unwrap else fn)(*args, **kwargs)
        reply = ("ok", result)
    except pytest.skip.Exception as exc:
        reply = ("skip", str(exc))
    except MissingCapability as exc:  # the test is not applicable to the target (the plugin's rule)
        reply = ("skip", f"not applicable: {exc}")
    except BaseException:  # CheckpointException is a BaseException
        reply = ("error", traceback.format_exc())
    try:
        conn.send(reply)
    except Exception:
        conn.send(("error", f"result could not be sent back:\n{traceback.format_exc()}"))


def _context() -> ForkServerContext:
    ctx = mp.get_context("forkserver")
    from ckptspec.spec.harness.surface.loading import current_target

    target = current_target()
    preload = ["torch", "torch.distributed", "pytest", "ckptspec.spec.harness.ranks.forked"]
    target_modules = (target.adapter.__name__, *target.adapter.MODULES.values())
    # Preloaded in the server unless their import initialises CUDA, which forked ranks could then not use
    # (ranks/fork_safety.py; on a GPU node a rank's own import of the target costs 1 to 3 s).
    if cuda_survives_fork(target_modules):
        preload += target_modules
    ctx.set_forkserver_preload(preload)
    return ctx


class GpuWaitTimeout(TimeoutError):
    """The GPUs a test needs stayed held by other tests past the wait: the test never started its ranks."""


class _GpuLease:
    """Exclusive use of `count` GPUs among all processes of this machine: one flock'ed file per device.

    So that concurrent tests (pytest -n auto) never put two ranks on one GPU. Holdings are all or
    nothing (a partial set is released before retrying), so two tests cannot deadlock. The wait is bounded by
    $CKPTSPEC_GPU_WAIT_S if set (several pytest runs sharing one GPU queue here: gpu_run sets it to a stage's
    budget), else by the test's rank timeout; past it, GpuWaitTimeout, a harness error that names no clause.
    Seen on an H200 (2026-11-26): eight concurrent runs serialised on it, and their 120 s waits ran out.
    """

    LOCK_DIR = os.path.join(tempfile.gettempdir(), "ckptspec-gpu-locks")
    WAIT_ENV = "CKPTSPEC_GPU_WAIT_S"

    def __init__(self, count: int, timeout: float):
        import fcntl

        import torch

        os.makedirs(self.LOCK_DIR, exist_ok=True)
        self._files: list[tuple[int, IO[str]]] = []
        timeout = float(os.environ.get(self.WAIT_ENV) or timeout)
        deadline = time.monotonic() + timeout
        while True:
            for device in range(torch.cuda.device_count()):
                # Held open (in self._files) as long as the lease holds its flock; release() closes it.
                f = open(os.path.join(self.LOCK_DIR, f"gpu{device}.lock"), "w")  # noqa: SIM115
                try:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    f.close()
                    continue
                self._files.append((device, f))
                if len(self._files) == count:
                    return
            self.release()
            if time.monotonic() > deadline:
                raise GpuWaitTimeout(
                    f"harness: {count} GPU(s) did not become free within {timeout:g} s (other tests held them; "
                    f"${self.WAIT_ENV} sets the wait): the test did not run"
                )
            time.sleep(0.2)

    @property
    def devices(self) -> tuple[int, ...]:
        return tuple(device for device, _ in self._files)

    def release(self) -> None:
        for _, f in self._files:
            f.close()  # closing the file drops its flock
        self._files = []


@dataclass
class _Ranks:
    """N started rank processes and the pipes to them."""

    spec: _WorldSpec
    procs: list[BaseProcess]
    conns: list[Connection]
    workdir: str
    outcomes: list[RankOutcome] = field(default_factory=list)
    lease: _GpuLease | None = None

    @classmethod
    def start(cls, world_size: int, backend: str, timeout: float, jobs: list[Job]) -> _Ranks:
        from ckptspec.spec.harness.surface.loading import current_target

        lease = _GpuLease(world_size, timeout) if backend == "nccl" else None
        workdir = tempfile.mkdtemp(prefix="ckptspec-ranks-")
        spec = _WorldSpec(
            world_size,
            backend,
            os.path.join(workdir, "store"),
            workdir,
            current_target().name,
            pg_timeout=max(timeout, 30.0) + 30.0,
            devices=lease.devices if lease else (),
        )
        ctx = _context()
        procs: list[BaseProcess] = []
        conns: list[Connection] = []
        for rank in range(world_size):
            parent_end, child_end = ctx.Pipe()
            proc = ctx.Process(target=_rank_main, args=(rank, spec, child_end, jobs[rank]), name=f"ckptspec-rank{rank}")
            proc.start()
            child_end.close()
            procs.append(proc)
            conns.append(parent_end)
        return cls(spec, procs, conns, workdir, lease=lease)

    def collect(self, timeout: float, expect_exit: dict[int, int]) -> list[RankOutcome]:
        """Wait for one reply (or exit) per rank, bounded by timeout and the failure grace."""
        self.outcomes = [RankOutcome() for _ in self.procs]
        deadline, failed_at = time.monotonic() + timeout, None
        while self.pending():
            limit = deadline if failed_at is None else min(deadline, failed_at + GRACE_AFTER_FAILURE)
            if time.monotonic() >= limit:
                break
            handles = [self.conns[r] for r in self.pending()] + [self.procs[r].sentinel for r in self.pending()]
            wait(handles, timeout=limit - time.monotonic())
            for rank in self.pending():
                if self._update(rank, expect_exit) and failed_at is None:
                    failed_at = time.monotonic()
        for rank in self.pending():
            self.outcomes[rank] = RankOutcome("hung", self._dump_stack(rank))
        return self.outcomes

    def pending(self) -> list[int]:
        return [r for r, o in enumerate(self.outcomes) if o.kind == "pending"]

    def _update(self, rank: int, expect_exit: dict[int, int]) -> bool:
        """Record rank's reply or exit if there is one; True if that is a failure."""
        outcome, proc = self.outcomes[rank], self.procs[rank]
        try:
            if self.conns[rank].poll():
                outcome.kind, outcome.detail = self.conns[rank].recv()
                return outcome.kind == "error" or rank in expect_exit
        except (EOFError, OSError):
            pass
        if proc.is_alive():
            return False
        proc.join()
        expected = rank in expect_exit and expect_exit[rank] == proc.exitcode
        outcome.kind, outcome.detail = ("expected_exit" if expected else "exit"), proc.exitcode
        return not expected

    def _dump_stack(self, rank: int) -> str:
        path = os.path.join(self.workdir, f"rank{rank}.stack")
        pid = self.procs[rank].pid
        assert pid is not None  # started by start()
        try:
            os.kill(pid, signal.SIGUSR1)
        except ProcessLookupError:
            return "(process already gone)"
        deadline = time.monotonic() + DUMP_WAIT
        while time.monotonic() < deadline and not os.path.getsize(path):
            time.sleep(0.05)
        time.sleep(0.1)  # let faulthandler finish writing every thread
        with open(path) as f:
            return f.read() or "(no stack was dumped)"

    def kill(self) -> None:
        """End every rank and everything it started (its process group, and what left it), remove the workdir."""
        from ckptspec.spec.harness.ranks import reaper

        for proc in self.procs:
            if proc.pid is not None:
                reaper.kill_tree(proc.pid)
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
        reaper.kill_marked(self.workdir)
        for proc in self.procs:
            proc.join(timeout=10)
        for conn in self.conns:
            conn.close()
        if self.lease is not None:
            self.lease.release()
        shutil.rmtree(self.workdir, ignore_errors=True)


class ForkedRunner:
    """The default Runner: ranks forked here, fresh for one run, or a pool's warm ranks kept between its runs."""

    def resolve_backend(self, backend: str, world_size: int) -> str:
        return _forked_backend(backend, world_size)

    def run(
        self,
        fn: Any,
        world_size: int,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        backend: str = "auto",
        timeout: float,
        unwrap: bool = False,
        pool: Any = None,
        expect_exit: dict[int, int] | None = None,
    ) -> list[Any]:
        """Run fn on fresh ranks (`pool` None; `expect_exit` declares deaths, which only forked ranks allow), or on
        the pool's warm ranks, respawned after any failure."""
        __tracebackhide__ = True
        if pool is not None:
            return self._run_pool(pool, job_of(fn, unwrap, args, kwargs or {}), timeout)
        backend, expect_exit = self.resolve_backend(backend, world_size), dict(expect_exit or {})
        job = job_of(fn, unwrap, args, kwargs or {})
        group = _Ranks.start(world_size, backend, timeout, [job] * world_size)
        try:
            for conn in group.conns:
                conn.send(None)  # one-shot: the rank stops after this job
            outcomes = group.collect(timeout, expect_exit)
        finally:
            group.kill()
        return finish(outcomes, timeout, expect_exit)

    def _run_pool(self, pool: Any, job: Job, timeout: float) -> list[Any]:
        __tracebackhide__ = True
        if pool._ranks is None:
            pool._ranks = _Ranks.start(pool.world_size, pool.backend, pool.timeout, [job] * pool.world_size)
        else:
            for conn in pool._ranks.conns:
                conn.send(job)
        outcomes = pool._ranks.collect(timeout, {})
        if any(o.kind != "ok" for o in outcomes):
            ranks_, pool._ranks = pool._ranks, None
            ranks_.kill()  # a failed process group may not be reusable: respawn on the next run
        return finish(outcomes, timeout, {})

    def close_pool(self, pool: Any) -> None:
        if pool._ranks is not None:
            ranks_, pool._ranks = pool._ranks, None
            for conn in ranks_.conns:
                with contextlib.suppress(OSError):
                    conn.send(None)
            deadline = time.monotonic() + 10
            for proc in ranks_.procs:
                proc.join(timeout=max(0.0, deadline - time.monotonic()))
            ranks_.kill()

    def note_forked(self) -> None:
        """Nothing to note: this runner forks every run."""


FORKED = ForkedRunner()
