"""One rank of a launched world (torchrun) running the multi-rank bodies that rank 0 sends it.

ckptspec.spec.harness.ranks.launched is the session around it (who runs which test, who reports); this module is what every
launched rank does with one message, rank 0 included:

- `RunBody`: join the run's process group (made from the launcher's store, the default group of ranks 0..n-1), give
  the body its pool's `rank_state`, run it in the main thread and post its reply to the store, as a forked rank
  sends it down its pipe: ("ok", result), ("skip", reason) or ("error", traceback). A watchdog thread waits for
  rank 0's stop request (`abort/<run>`, after a failure or at the timeout): it then posts ("hung", stack) with
  this rank's stack (faulthandler, every thread) and interrupts the body (SIGUSR2 raises `Stopped` in the main
  thread, again every second until the body has unwound).
- `Close`: a pool is closed. `End`: the session is over.

A launched rank lives as long as the job, so what the forked runner gets by ending a rank's processes is done
here by hand: the process group of a one-shot run (`@ranks`) is destroyed after it, `rank_state` is kept per pool
(cleared when the pool is respawned after a failure), and processes a body started and left running are killed
(by pid, identity checked by psutil) after a one-shot run, and for a pool when it is closed or respawned.
"""

from __future__ import annotations

import contextlib
import faulthandler
import gc
import importlib
import os
import pickle
import signal
import tempfile
import threading
import time
import traceback
from collections import defaultdict
from collections.abc import Hashable
from dataclasses import dataclass
from datetime import timedelta
from types import FrameType
from typing import TYPE_CHECKING, Any

from ckptspec.spec.harness.ranks.reaper import collect_garbage
from ckptspec.spec.harness.ranks.vocabulary import Job, rank_state

if TYPE_CHECKING:
    import psutil

Store = Any
"""A torch.distributed Store (the launcher's, prefixed): typed loosely, since torch's stubs say its values are str
(it takes bytes) and lack clone()."""

Group = tuple[int, int, str, float]
"""A run's default process group: (process group id, number of ranks, backend, timeout in seconds)."""

__all__ = ["Close", "End", "RankSide", "RunBody", "Stopped", "World", "connect"]

LAUNCHER_VARS = (
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_USE_AGENT_STORE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
)
"""What torchrun tells its workers; read once, then removed, so that no process a test starts takes itself for one."""
IDLE_WAIT = timedelta(minutes=10)  # one blocking wait for the next message (torch logs a line at each expiry)
POLL = 0.05
BEAT = 1.0  # seconds between heartbeats
GC_BOUND = 30.0  # seconds for collecting a dropped run's garbage (a finalizer may block)
STUCK_EXIT = 3  # exit status of a rank still inside a body when the session ends (it could not be stopped)


class Stopped(BaseException):
    """Raised in a body that rank 0 asked to stop (after another rank failed, or at the timeout)."""


@dataclass(frozen=True)
class World:
    rank: int
    size: int
    local_rank: int
    local_size: int
    nodes: int
    run_id: str


@dataclass(frozen=True)
class RunBody:
    k: int  # the run's number, the same on every rank
    job: Job  # vocabulary.job_of: (module, qualname, unwrap, args, kwargs)
    group: Group  # (process group id, n, backend, timeout s): the body's default group
    state: tuple[str, int]  # (key, epoch): whose rank_state the body sees; a new epoch starts it empty
    one_shot: bool  # @ranks: group, state and leftover processes are dropped after the run


@dataclass(frozen=True)
class Close:
    key: str


@dataclass(frozen=True)
class End:
    status: int  # rank 0's exit status, which every rank exits with (torchrun then reports the job on each node)


def connect(timeout: float = 600.0) -> tuple[World, Store]:
    """This process's place in the launched world and the launcher's store (a client; prefixed for this run)."""
    import torch.distributed as dist

    env = os.environ
    world = World(
        rank=int(env["RANK"]),
        size=int(env["WORLD_SIZE"]),
        local_rank=int(env.get("LOCAL_RANK", "0")),
        local_size=int(env.get("LOCAL_WORLD_SIZE", "1")),
        nodes=int(env.get("GROUP_WORLD_SIZE", "1")),
        run_id=env["TORCHELASTIC_RUN_ID"],
    )
    store, _, _ = next(dist.rendezvous("env://", timeout=timedelta(seconds=timeout)))
    # A restarted job (torchrun --max-restarts) starts its sessions afresh: keys of an earlier attempt do not count.
    attempt = env.get("TORCHELASTIC_RESTART_COUNT", "0")
    for var in LAUNCHER_VARS:
        env.pop(var, None)
    return world, dist.PrefixStore(f"ckptspec/{world.run_id}/{attempt}", store)


def post(store: Store, key: str, value: object) -> None:
    store.set(key, pickle.dumps(value))


def take(store: Store, key: str) -> Any:
    """The value at key, removed from the store."""
    value = pickle.loads(store.get(key))
    store.delete_key(key)
    return value


def _stack() -> str:
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.dump_traceback(file=f, all_threads=True)
        f.seek(0)
        return f.read() or "(no stack was dumped)"


def _call(job: Job) -> Any:
    module, qualname, unwrap, args, kwargs = job
    fn: Any = importlib.import_module(module)
    for part in qualname.split("."):
        fn = getattr(fn, part)
    return (fn.__wrapped__ if unwrap else fn)(*args, **kwargs)


def _children() -> dict[int, psutil.Process]:
    import psutil

    return {p.pid: p for p in psutil.Process().children(recursive=True)}


def _helpers() -> set[int]:
    """multiprocessing's forkserver and resource tracker: started once per process, reused by every later body."""
    from multiprocessing import forkserver, resource_tracker

    pids = (
        getattr(forkserver._forkserver, "_forkserver_pid", None),
        getattr(resource_tracker._resource_tracker, "_pid", None),
    )
    return {pid for pid in pids if pid}


class _Watchdog(threading.Thread):
    """Waits, while a body runs, for rank 0's request to stop it; then answers for the body and interrupts it."""

    def __init__(self, side: RankSide):
        super().__init__(name="ckptspec-watchdog", daemon=True)
        self.side, self.store = side, side.store.clone()
        self.armed = threading.Condition()
        self.k: int | None = None
        self.done = False

    def arm(self, k: int | None) -> None:
        with self.armed:
            self.k = k
            self.armed.notify()

    def run(self) -> None:
        beat, next_beat = f"beat/{self.side.world.rank}", 0.0
        while not self.done:
            if time.monotonic() >= next_beat:  # rank 0 takes a rank whose count stops for a lost one
                self.store.add(beat, 1)
                next_beat = time.monotonic() + BEAT
            with self.armed:
                if self.k is None:
                    self.armed.wait(BEAT)
                k = self.k
            if k is None:
                continue
            if self.side.stopping(k):  # again, every second, until the body has unwound
                signal.pthread_kill(threading.main_thread().ident or 0, signal.SIGUSR2)
                time.sleep(1.0)
            elif self.store.check([f"abort/{k}"]):
                self.side.stop(k, self.store)
            elif self.store.check(["end"]):
                os.write(2, f"ckptspec: rank {self.side.world.rank} is still in a body at the end; exiting\n".encode())
                os._exit(STUCK_EXIT)
            time.sleep(POLL * 2)


class RankSide:
    """The launched rank's state between messages: its process group, the pools' rank_state, what bodies left running."""

    def __init__(self, world: World, store: Store) -> None:
        self.world, self.store = world, store
        self._group: int | None = None
        self._group_owner: str | None = None
        self._current: str | None = None  # whose state rank_state holds
        self._saved: dict[str, dict[Hashable, Any]] = {}
        self._epochs: dict[str, int] = {}
        self._spawned: dict[str, dict[int, psutil.Process]] = defaultdict(dict)
        self._lock = threading.Lock()
        self._body: int | None = None  # the run whose body the main thread is in
        self._answered: set[int] = set()
        signal.signal(signal.SIGUSR2, self._interrupt)
        self._watchdog = _Watchdog(self)
        self._watchdog.start()

    # ------------------------------------------------------------------------------ messages

    def serve(self) -> int:
        """Run rank 0's messages in order until End (a rank other than 0 does nothing else); rank 0's exit status."""
        import torch.distributed as dist

        for i in range(1 << 62):
            key = f"msg/{self.world.rank}/{i}"
            while True:
                try:
                    self.store.wait([key], IDLE_WAIT)
                    break
                except dist.DistStoreError as exc:
                    if isinstance(exc, dist.DistNetworkError):
                        raise
            msg = take(self.store, key)
            if isinstance(msg, End):
                self.close()
                self.store.set(f"bye/{self.world.rank}", b"1")
                return msg.status
            self.execute(msg)
        raise AssertionError("unreachable")

    def close(self) -> None:
        """The session is over: every pool's state and processes go, and the process group is destroyed."""
        for key in {*self._saved, *self._spawned, *self._epochs, self._current or ""} - {""}:
            self._drop(key)
        self._leave()
        self._watchdog.done = True  # not left inside a store call at interpreter exit
        self._watchdog.arm(None)
        self._watchdog.join(timeout=5)

    def execute(self, msg: RunBody | Close) -> None:
        if isinstance(msg, Close):
            self._drop(msg.key)
            return
        key, epoch = msg.state
        self._use_state(key, epoch)
        try:
            self._join(msg.group, key)
        except Exception:
            post(
                self.store, f"out/{msg.k}/{self.world.rank}", ("error", f"rank setup failed:\n{traceback.format_exc()}")
            )
            self._leave()
            if msg.one_shot:
                self._drop(key)
            return
        before = _children()
        with contextlib.suppress(Stopped):  # a stop request that came as the body returned
            self._run(msg)
        self._spawned[key].update({pid: p for pid, p in _children().items() if pid not in before})
        if msg.one_shot:
            self._drop(key)

    def _run(self, msg: RunBody) -> None:
        # What a forked rank's environment says; restored after the body (rank 0's is the pytest process's).
        saved = {var: os.environ.get(var) for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
        os.environ.update(
            RANK=str(self.world.rank), WORLD_SIZE=str(msg.group[1]), LOCAL_RANK=str(self.world.local_rank)
        )
        # Children a body forks (temporal callers) inherit this heap; frozen, it is never collected in them. An earlier
        # run's garbage (its process group's C++ objects) freed in a child forked from this multi-threaded process
        # crashed the child (a segfault in a 2 x 4 loopback run); it is collected here when its run is dropped.
        gc.freeze()
        with self._lock:
            self._body = msg.k
        self._watchdog.arm(msg.k)
        try:
            reply: tuple[str, Any] = ("ok", _call(msg.job))
        except Stopped:
            reply = ("error", "stopped")  # never posted: the watchdog has answered
        except BaseException as exc:  # CheckpointException is a BaseException
            import pytest

            from ckptspec.spec.harness.surface.loading import MissingCapability

            if isinstance(exc, pytest.skip.Exception):
                reply = ("skip", str(exc))
            elif isinstance(exc, MissingCapability):  # not applicable to the target (the plugin's rule)
                reply = ("skip", f"not applicable: {exc}")
            else:
                reply = ("error", traceback.format_exc())
        finally:
            self._body = None
            self._watchdog.arm(None)
            for var, value in saved.items():
                if value is None:
                    os.environ.pop(var, None)
                else:
                    os.environ[var] = value
        with self._lock:
            if msg.k in self._answered:
                return
            self._answered.add(msg.k)
        try:
            post(self.store, f"out/{msg.k}/{self.world.rank}", reply)
        except Exception:
            post(
                self.store,
                f"out/{msg.k}/{self.world.rank}",
                ("error", f"result could not be sent back:\n{traceback.format_exc()}"),
            )

    def stop(self, k: int, store: Store) -> None:
        """(watchdog thread) Answer run k for the body, with this rank's stack; the watchdog then interrupts it."""
        with self._lock:
            if self._body != k or k in self._answered:
                return
            self._answered.add(k)
            post(store, f"out/{k}/{self.world.rank}", ("hung", _stack()))

    def stopping(self, k: int) -> bool:
        return self._body == k and k in self._answered

    def _interrupt(self, signum: int, frame: FrameType | None) -> None:
        if self._body is not None and self._body in self._answered:
            raise Stopped(f"rank {self.world.rank}: stopped by rank 0")

    # ---------------------------------------------------------------- process group and state

    def _join(self, group: Group, owner: str) -> None:
        import torch
        import torch.distributed as dist

        group_id, n, backend, pg_timeout = group
        if self._group == group_id:
            return
        self._leave()
        from ckptspec.spec.harness.surface.loading import current_target

        if backend == "nccl":
            torch.cuda.set_device(self.world.local_rank % torch.cuda.device_count())
        dist.init_process_group(
            current_target().backend(backend),
            store=dist.PrefixStore(f"pg{group_id}", self.store),
            rank=self.world.rank,
            world_size=n,
            timeout=timedelta(seconds=pg_timeout),
        )
        self._group, self._group_owner = group_id, owner
        dist.barrier()  # as forked ranks do: start the body only when every rank has joined

    def _leave(self) -> None:
        import torch.distributed as dist

        if self._group is not None and dist.is_initialized():
            dist.destroy_process_group()
        self._group = self._group_owner = None

    def _use_state(self, key: str, epoch: int) -> None:
        if self._current != key:
            if self._current is not None:
                self._saved[self._current] = dict(rank_state)
            rank_state.clear()
            rank_state.update(self._saved.pop(key, {}))
            self._current = key
        if self._epochs.setdefault(key, epoch) != epoch:  # the pool was respawned after a failure
            self._end_spawned(key)
            rank_state.clear()
            self._epochs[key] = epoch

    def _drop(self, key: str) -> None:
        """A one-shot run is over, or its pool is closed: its processes, state and process group go."""
        self._end_spawned(key)
        self._saved.pop(key, None)
        self._epochs.pop(key, None)
        if self._current == key:
            rank_state.clear()
            self._current = None
        if self._group_owner == key:
            self._leave()
        collect_garbage(GC_BOUND, unfreeze=True)

    def _end_spawned(self, key: str) -> None:
        import psutil

        helpers = _helpers()
        procs = [p for pid, p in self._spawned.pop(key, {}).items() if pid not in helpers]
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.kill()  # psutil refuses a pid that now names another process
        psutil.wait_procs(procs, timeout=5)
