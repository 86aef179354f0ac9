"""Multi-rank bodies on the ranks a launcher started (torchrun, or srun running torchrun) instead of forked ones.

    torchrun --nnodes=N --nproc-per-node=G [--rdzv-backend=c10d --rdzv-endpoint=HOST:PORT] -m pytest ckptspec/spec ...

Every rank runs pytest with the same arguments and collects; rank 0 checks that every rank collected the same tests
(a node with another checkout or target is refused). Rank 0 then runs the session as a run without a launcher
does: fixtures, hypothesis examples and each test's own code run there, once, and only rank 0 reports (terminal
summary, --conformance-json). The other ranks run no test: each serves the multi-rank bodies rank 0 sends it, in
the same order everywhere (ckptspec.spec.harness.ranks.launched_rank), until the session ends. Hypothesis data is drawn
once, on rank 0, and sent with the body, as forked ranks receive it: no rank has to draw the same examples.

A body for n ranks runs on ranks 0..n-1 of the launched world, spanning nodes as the launcher placed them, in a
process group of their own made from the launcher's store: their *default* group, so that a body's `dist.barrier()`
and the target's collectives see exactly n ranks, as with forked ranks (a `new_group` sub-group would not be what a
body or a target talks to). Ranks n.. take no part. A test needing more ranks than the world skips with the reason.
Every rank's reply comes back through the store, within the run's timeout; after a failure (plus a grace period)
or at the timeout, rank 0 asks the ranks still running to stop: each answers with its stack and is interrupted, and
the test fails with one RankFailures covering every rank, as forked runs do.

A body that kills its rank on purpose (`expect_exit`) would end the launched job: such a run forks its ranks on
rank 0's node, as without a launcher, and the terminal summary lists those tests. pytest-xdist must be off.
$CKPTSPEC_LAUNCH=off turns this mode off (forked ranks under torchrun).
"""

from __future__ import annotations

import hashlib
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

from ckptspec.spec.harness.ranks.launched_rank import Close, End, RankSide, RunBody, Store, World, connect, post, take
from ckptspec.spec.harness.ranks.vocabulary import (
    DUMP_WAIT,
    GRACE_AFTER_FAILURE,
    RankFailures,
    RankOutcome,
    finish,
    job_of,
)

__all__ = ["ENV", "Driver", "active", "configure", "current"]

ENV = "CKPTSPEC_LAUNCH"
COLLECT_WAIT = 1800.0  # seconds rank 0 waits for the other ranks' collection (a slow shared file system)
END_WAIT = 60.0
ANSWER_WAIT = DUMP_WAIT + 8.0  # after a stop request: for each rank to dump its stack and answer
POLL = 0.01
GONE_AFTER = 60.0  # seconds without a heartbeat after which a rank is lost
BEAT_CHECK = 1.0
Beat = tuple[int, float, float]  # a rank's heartbeat as a collector saw it: (count, when it changed, when read)
GONE = "(lost: no heartbeat for {:g}s; its process is gone, see its node's launcher for the exit status)"
NO_ANSWER = "(no answer to the stop request: the rank is stuck outside Python, e.g. in a collective, or is gone)"

_driver: Driver | None = None
_side: RankSide | None = None


def current() -> Driver | None:
    """Rank 0's driver when this pytest runs under a launcher, else None (forked ranks)."""
    return _driver


def active() -> bool:
    """Whether this process is a launched rank (any rank), so that multi-rank bodies run on the launched world."""
    return _side is not None


def launched_by_torchrun(environ: Mapping[str, str] = os.environ) -> bool:
    return environ.get(ENV, "auto") != "off" and "TORCHELASTIC_RUN_ID" in environ and "MASTER_ADDR" in environ


def configure(config: pytest.Config) -> None:
    """From the spec plugin's pytest_configure: join the launched world if a launcher started this process."""
    global _driver, _side
    if not launched_by_torchrun() or hasattr(config, "workerinput"):
        return
    if config.getoption("numprocesses", None) or config.getoption("dist", "no") != "no":
        raise pytest.UsageError(
            "under torchrun the launched ranks run the multi-rank tests and pytest-xdist must be off: "
            "drop -n/--dist (or give -n 0, or -p no:xdist)"
        )
    try:
        world, store = connect()
    except (RuntimeError, KeyError, ValueError) as exc:  # DistStoreError, DistNetworkError: nobody listens
        raise pytest.UsageError(
            f"ckptspec: could not join torchrun's store (MASTER_ADDR, MASTER_PORT): {exc}"
        ) from None
    _side = RankSide(world, store)
    if world.rank == 0:
        _driver = Driver(world, store, _side)
    else:  # quiet: rank 0 reports
        config.option.verbose, config.option.reportchars = -2, ""
        config.option.no_header = config.option.no_summary = True
    config.pluginmanager.register(_Session(world, store), "ckptspec-launched")


def reports() -> bool:
    """Whether this process writes the report and the conformance JSON (rank 0, or no launcher)."""
    return _side is None or _side.world.rank == 0


@dataclass
class _Plan:
    """Rank 0's view of one pool (or one-shot run): its process group and its state's epoch."""

    key: str
    group: int | None = None
    backend: str = ""
    epoch: int = 0


class _Collector(threading.Thread):
    """(rank 0) Waits for every rank's reply to run k; stops the rest after a failure's grace or at the timeout.

    A rank whose heartbeat stopped for GONE_AFTER seconds is lost (its process died, and its node's launcher with
    it): it is reported hung, with that reason, and listed in `gone`.
    """

    def __init__(self, store: Store, k: int, n: int, timeout: float, beats: dict[int, Beat]):
        super().__init__(name="ckptspec-collector", daemon=True)
        self.store, self.k, self.timeout = store, k, timeout
        self.outcomes = [RankOutcome() for _ in range(n)]
        self.gone: list[int] = []
        self.beats = beats  # rank -> (last count seen, when it changed, when it was read): kept across runs

    def _lost(self, rank: int, now: float) -> bool:
        count, changed, read = self.beats.get(rank, (-1, now, 0.0))
        if now - read < BEAT_CHECK:
            return False
        latest = self.store.add(f"beat/{rank}", 0)
        if latest != count:
            changed = now
        self.beats[rank] = (latest, changed, now)
        return bool(now - changed > GONE_AFTER)

    def run(self) -> None:
        deadline, failed_at, stopped_at = time.monotonic() + self.timeout, None, None
        while pending := [r for r, o in enumerate(self.outcomes) if o.kind == "pending"]:
            now = time.monotonic()
            for rank in pending:
                key, o = f"out/{self.k}/{rank}", self.outcomes[rank]
                if self.store.check([key]):
                    o.kind, o.detail = take(self.store, key)
                elif self._lost(rank, now):
                    o.kind, o.detail = "hung", GONE.format(GONE_AFTER)
                    self.gone.append(rank)
                if o.kind in ("error", "hung") and failed_at is None:
                    failed_at = now
            if stopped_at is None:
                if now >= (deadline if failed_at is None else min(deadline, failed_at + GRACE_AFTER_FAILURE)):
                    self.store.set(f"abort/{self.k}", b"1")
                    stopped_at = now
            elif now >= stopped_at + ANSWER_WAIT:
                break
            time.sleep(POLL)
        for o in self.outcomes:
            if o.kind == "pending":
                o.kind, o.detail = "hung", NO_ANSWER


class Driver:
    """(rank 0) Sends runs to the launched ranks and gathers their replies; one per session."""

    def __init__(self, world: World, store: Store, side: RankSide):
        self.world, self.store, self.side = world, store, side
        self._sent = [0] * world.size  # messages sent to each rank
        self._runs = self._groups = 0
        self._holds: list[int | None] = [None] * world.size  # the process group each rank is in
        self._plans: dict[int, _Plan] = {}  # id(RankPool) -> plan
        self.forked: list[str] = []  # tests whose ranks were forked (expect_exit)
        self.gone: dict[int, str] = {}  # lost ranks -> the test that noticed
        self._beats: dict[int, Beat] = {}  # the collectors' view of every rank's heartbeat

    def send(self, rank: int, msg: RunBody | Close | End) -> None:
        post(self.store, f"msg/{rank}/{self._sent[rank]}", msg)
        self._sent[rank] += 1

    def resolve_backend(self, backend: str, world_size: int) -> str:
        """As ranks.resolve_backend, for launched ranks: one GPU per rank of a node (LOCAL_RANK)."""
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if backend == "auto":
            return "nccl" if gpus >= self.world.local_size else "gloo"
        if backend == "nccl" and gpus < self.world.local_size:
            pytest.skip(
                f"needs a CUDA device per rank for NCCL: {self.world.local_size} ranks per node, {gpus} devices"
            )
        return backend

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
    ) -> list[Any]:
        """Run fn(*args, **kwargs) on launched ranks 0..world_size-1; each rank's result, or RankFailures."""
        __tracebackhide__ = True
        job = job_of(fn, unwrap, args, kwargs or {})
        if world_size > self.world.size:
            pytest.skip(
                f"needs {world_size} ranks; the launched world has {self.world.size} "
                f"({self.world.nodes} node(s); torchrun --nnodes x --nproc-per-node)"
            )
        lost = [f"rank {r} (lost during {self.gone[r]})" for r in range(world_size) if r in self.gone]
        if lost:
            raise RankFailures(f"the launched world has lost {', '.join(lost)}: no {world_size}-rank body can run")
        backend = self.resolve_backend(backend, world_size)
        self._runs += 1
        k, members = self._runs, range(world_size)
        plan = self._plans.setdefault(id(pool), _Plan(f"pool{k}")) if pool is not None else _Plan(f"run{k}")
        if plan.group is None or plan.backend != backend or any(self._holds[r] != plan.group for r in members):
            # A new process group (the pool's first, or after another pool's group took its ranks): the pool's
            # rank_state may hold groups of the old one (new_group), so it starts empty, as a respawned pool's does.
            self._groups += 1
            plan.group, plan.backend, plan.epoch = self._groups, backend, plan.epoch + 1
            for r in members:
                self._holds[r] = plan.group
        pg_timeout = max(pool.timeout if pool is not None else timeout, 30.0) + 30.0
        msg = RunBody(k, job, (plan.group, world_size, backend, pg_timeout), (plan.key, plan.epoch), pool is None)
        for rank in members[1:]:
            self.send(rank, msg)
        collector = _Collector(self.store.clone(), k, world_size, timeout, self._beats)
        collector.start()
        self.side.execute(msg)
        collector.join()
        self.gone.update((r, _current_test()) for r in collector.gone)
        if pool is None or any(o.kind != "ok" for o in collector.outcomes):
            plan.group = None  # as the forked runner respawns a pool after a failure
            for r in members:
                self._holds[r] = None
        return finish(collector.outcomes, timeout, {})

    def close_pool(self, pool: Any) -> None:
        plan = self._plans.pop(id(pool), None)
        if plan is None:
            return
        for rank in range(1, pool.world_size):
            self.send(rank, Close(plan.key))
        self.side.execute(Close(plan.key))
        for rank in range(pool.world_size):
            if self._holds[rank] == plan.group:
                self._holds[rank] = None

    def note_forked(self) -> None:
        self.forked.append(_current_test())

    def end(self, status: int) -> list[int]:
        """Tell every rank that the session is over (and its exit status); the ranks that did not acknowledge."""
        self.store.set("end", b"1")
        for rank in range(1, self.world.size):
            if rank not in self.gone:
                self.send(rank, End(int(status)))
        self.side.close()
        deadline = time.monotonic() + END_WAIT
        missing = [r for r in range(1, self.world.size) if r not in self.gone]
        while missing and time.monotonic() < deadline:
            missing = [r for r in missing if not self.store.check([f"bye/{r}"])]
            time.sleep(0.1)
        return missing


def _current_test() -> str:
    return os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]


def _digest(items: Iterable[pytest.Item]) -> tuple[str, list[str]]:
    ids = sorted(item.nodeid for item in items)
    return hashlib.sha256("\n".join(ids).encode()).hexdigest(), ids


class _Session:
    """The pytest hooks of launched mode, on every rank."""

    def __init__(self, world: World, store: Store) -> None:
        self.world, self.store = world, store
        self.missing: list[int] = []
        self.status: int | None = None  # (ranks other than 0) rank 0's exit status

    def pytest_report_header(self, config: pytest.Config) -> list[str]:
        return [
            f"ckptspec launch: {self.world.size} launched ranks on {self.world.nodes} node(s) "
            f"({self.world.local_size} per node); multi-rank bodies run on them, rank 0 reports"
        ]

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        digest, ids = _digest(session.items)
        post(self.store, f"collected/{self.world.rank}", (digest, ids))
        if self.world.rank != 0:
            return
        deadline, problems = time.monotonic() + COLLECT_WAIT, []
        for rank in range(1, self.world.size):
            while not self.store.check([f"collected/{rank}"]):
                if time.monotonic() > deadline:
                    pytest.exit(f"ckptspec: rank {rank} did not finish collecting within {COLLECT_WAIT:g}s", 4)
                time.sleep(0.1)
            other, other_ids = take(self.store, f"collected/{rank}")
            if other != digest:
                only_here, only_there = sorted(set(ids) - set(other_ids)), sorted(set(other_ids) - set(ids))
                problems.append(
                    f"rank {rank} collected {len(other_ids)} tests, rank 0 {len(ids)}; only on rank 0: "
                    f"{only_here[:3]}, only on rank {rank}: {only_there[:3]}"
                )
        if problems:
            pytest.exit(
                "ckptspec: the launched ranks collected different tests (same checkout, target and "
                "arguments on every node?):\n  " + "\n  ".join(problems),
                4,
            )

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtestloop(self, session: pytest.Session) -> bool | None:
        if self.world.rank == 0:
            return None
        try:
            assert _side is not None
            self.status = _side.serve()
        except Exception as exc:  # the store is gone: rank 0's node ended the job
            os.write(2, f"ckptspec: rank {self.world.rank} lost the launched session: {exc}\n".encode())
            self.status = pytest.ExitCode.INTERNAL_ERROR
        return True

    @pytest.hookimpl(trylast=True)
    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Rank 0 is done: the other ranks may exit now (with a failing status, the first to exit makes torchrun stop
        its node's other ranks: rank 0 must not be stopped before its report is written)."""
        try:
            if _driver is not None:
                self.store.set("closed", b"1")
            elif self.status is not None:
                deadline = time.monotonic() + END_WAIT
                while not self.store.check(["closed"]) and time.monotonic() < deadline:
                    time.sleep(0.1)
        except Exception:  # the store is gone with rank 0's node: nothing to wait for
            pass

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int | pytest.ExitCode) -> None:
        if _driver is not None:
            self.missing = _driver.end(exitstatus)
        elif self.status is not None:
            # Rank 0's status: a node whose ranks all exit 0 while rank 0's fail would wait at torchrun's exit
            # barrier (5 minutes) for the failed node, which never comes.
            session.exitstatus = self.status

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        if _driver is None:
            return
        if _driver.forked:
            terminalreporter.write_line(
                f"ckptspec: {len(_driver.forked)} test(s) forked their ranks on rank 0's node (they kill a rank on "
                f"purpose, which would end a launched job): {', '.join(_driver.forked)}"
            )
        for rank, test in _driver.gone.items():
            terminalreporter.write_line(f"ckptspec: rank {rank} was lost during {test}", red=True)
        for rank in self.missing:
            terminalreporter.write_line(f"ckptspec: rank {rank} did not acknowledge the end of the session", red=True)
