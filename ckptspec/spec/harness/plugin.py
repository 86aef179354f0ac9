"""The pytest plugin every suite of this project loads (`-p ckptspec.spec.harness.plugin` in the addopts of
pyproject.toml, so that its options are known before pytest reads the command line's paths; the root conftest
loads it too, for a run with another ini file).

- `--impl NAME` (or $CKPTSPEC_IMPL) selects the target; the name is written back to the environment.
- `@pytest.mark.spec("AQ-3", ...)` cites clauses of `ckptspec/spec/clauses/*.toml`. In ckptspec/spec/ and
  ckptspec/faults/ every test must cite at least one; an unknown id is an error.
- `@pytest.mark.needs("capability", ...)` skips when the target lacks a capability (an unknown capability is an
  error); `@pytest.mark.gpu` skips without CUDA; a test the target cannot take part in is "not applicable"
  (ckptspec.spec.harness.applicability).
- `--tensor-device cpu|cuda` (or $CKPTSPEC_TENSOR_DEVICE): where tests marked `tensor_device` (the snapshot
  family) keep the trainer's state (ckptspec.spec.harness.ranks.devices); recorded in the conformance JSON.
- The target's expectations file turns listed tests into xfails, with clause and reason
  (ckptspec.spec.harness.expectations: strict, but for hypothesis tests under a randomized profile); an entry with
  `versions` only for the releases it names, matched against the version the run imported. An entry that
  matches no test of a file the run collected whole is listed in the terminal summary; an error when $CI is set.
- A failing test's traceback ends with the statement of every clause it cites (exception notes).
- `--conformance-json PATH` records every test's outcome with its clauses, and for an expected failure its entry
  and how it failed (see ckptspec.report.runs); an expected failure that fails otherwise than its entry says
  (raises / match) is reported failed.
- Hypothesis profiles `ci` (derandomized: what CI runs, and the default), `explore` and `nightly` (randomized),
  chosen by --hypothesis-profile, else $HYPOTHESIS_PROFILE, else `ci` (ckptspec.spec.harness.profiles).
- Under torchrun, multi-rank bodies run on the launched ranks and only rank 0 reports (ckptspec.spec.harness.ranks.launched).
- Every process of a run computes with one torch thread ($OMP_NUM_THREADS=1, inherited by workers, ranks and the
  targets' own processes), unless $OMP_NUM_THREADS is set or benchmarks are timed (--benchmark-enable): the tests'
  tensors are small, and on a loaded machine OpenMP's waiting threads made each operation far slower (a training
  step of the goodput smoke test: 0.6 s with 2 threads, 0.01 s with one, on 2 cores at a load of 8).

Bad input is one line, never a traceback: a bad option value or environment variable, a malformed clause or
expectations file, or a target whose package is missing is a usage error at start (exit status 4); a wrong
citation, an unknown capability or an expectation entry that does not fit its test is a collection error naming
the test file (reported the same way by xdist workers, where raising would be an INTERNALERROR).
"""

from __future__ import annotations

import os
import sys
from collections import defaultdict
from collections.abc import Callable, Generator, Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from _pytest.reports import CollectReport
from hypothesis import settings

from ckptspec.report import clauses as clause_registry
from ckptspec.report import provenance
from ckptspec.report.run_file import EntryRecord, FailureRecord, PhaseRecord, RunFile
from ckptspec.spec.harness import applicability, expectations
from ckptspec.spec.harness.profiles import in_ci, load_profile
from ckptspec.spec.harness.ranks import RankPool, devices, launched, reaper, use_runner
from ckptspec.spec.harness.surface.loading import (
    CAPABILITY_DOCS,
    ENV_VAR,
    Target,
    TargetError,
    TargetUnavailable,
    load_target,
    torch_below_supported,
)

# What the plugin keeps on the run's pytest.Config.
_TARGET = pytest.StashKey[Target]()
_PROFILE = pytest.StashKey[str]()
_TENSOR_DEVICE = pytest.StashKey[str]()
_STALE = pytest.StashKey[list[str]]()  # expectations entries that matched no collected test
_REAPED = pytest.StashKey[list[str]]()  # processes left running by tests, killed

_CITING_DIRS = ("ckptspec/spec", "ckptspec/faults")
MARKERS = (
    "spec(*ids): clauses of ckptspec/spec/clauses/*.toml that the test checks",
    "needs(*capabilities): skip unless the target has these capabilities",
    "gpu: needs a CUDA device",
    devices.MARKER,
)
# Exceptions of a test that are not failures: no clause notes for them.
_NOT_FAILURES = (pytest.skip.Exception, pytest.xfail.Exception, pytest.exit.Exception, KeyboardInterrupt)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("ckptspec")
    group.addoption("--impl", default=None, help=f"target implementation (default: ${ENV_VAR} or 'impl')")
    group.addoption(
        "--conformance-json", default=None, metavar="PATH", help="write each test's outcome and clauses to PATH"
    )
    devices.add_option(group)


@pytest.hookimpl(tryfirst=True)  # before hypothesis's own pytest plugin loads --hypothesis-profile
def pytest_configure(config: pytest.Config) -> None:
    _one_torch_thread(config)
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    if hasattr(config, "workerinput"):
        os.environ[reaper.WORKER_MARK] = _worker_mark(config.workerinput)
    try:
        name = config.getoption("--impl") or os.environ.get(ENV_VAR) or "impl"
        os.environ[ENV_VAR] = name
        config.stash[_TARGET] = load_target(name)
        config.stash[_PROFILE] = load_profile(config)
        config.stash[_TENSOR_DEVICE] = devices.configure(config.getoption("--tensor-device"))
        clause_registry.load()
        expectations.load(config.stash[_TARGET].expectations_path)
        launched.configure(config)
        use_runner(launched.current())  # None without a launcher: forked ranks
        if not hasattr(config, "workerinput") and launched.reports():
            _check_writable(config.getoption("--conformance-json"))
    except (TargetError, TargetUnavailable, clause_registry.ClauseError, expectations.ExpectationsError) as exc:
        raise pytest.UsageError(str(exc)) from None
    config.pluginmanager.register(applicability, "ckptspec-applicability")
    if not hasattr(config, "workerinput") and launched.reports():
        config.pluginmanager.register(_Recorder(config), "ckptspec-recorder")


def _one_torch_thread(config: pytest.Config) -> None:
    """One torch thread in this process and every process it starts (see the module docstring)."""
    if os.environ.get("OMP_NUM_THREADS") or config.getoption("benchmark_enable", default=False):
        return
    os.environ["OMP_NUM_THREADS"] = "1"
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def _worker_mark(workerinput: dict[str, Any]) -> str:
    return f"{workerinput['testrunuid']}/{workerinput['workerid']}"


def _check_writable(path: str | None) -> None:
    """Refuse a --conformance-json PATH that the end of the run could not write."""
    if path is None:
        return
    target = Path(path).absolute()
    problem = None
    if target.is_dir():
        problem = "is a directory; give the path of a file"
    elif target.exists():
        problem = None if os.access(target, os.W_OK) else "is not writable"
    else:
        ancestor = target.parent
        while not ancestor.exists():
            ancestor = ancestor.parent
        if not ancestor.is_dir():
            problem = f"cannot be created: {ancestor} is not a directory"
        elif not os.access(ancestor, os.W_OK | os.X_OK):
            problem = f"cannot be created: directory {ancestor} is not writable"
    if problem:
        raise pytest.UsageError(f"--conformance-json {path} {problem}")


def pytest_report_header(config: pytest.Config) -> list[str]:
    target = config.stash[_TARGET]
    env = {k: v for k, v in os.environ.items() if k.startswith(("CKPTSPEC", "HYPOTHESIS"))}
    return [
        f"ckptspec target: {target.name} {target.version} "
        f"capabilities: {', '.join(sorted(target.capabilities)) or '-'}",
        f"hypothesis profile: {config.stash[_PROFILE]}; tensor device: {config.stash[_TENSOR_DEVICE]}; "
        f"environment: {env}",
        *filter(None, [torch_below_supported()]),
    ]


# ---------------------------------------------------------------------------------- collection


def _cited(item: pytest.Item) -> list[str]:
    return [cid for mark in item.iter_markers("spec") for cid in mark.args]


def _below(path: Path, directory: str) -> bool:
    """Whether `path` lies in the checkout's (or site-packages') `directory` (`ckptspec/spec`), wherever the root is."""
    wanted = tuple(directory.split("/"))
    parts = Path(path).parts
    return any(parts[i : i + len(wanted)] == wanted for i in range(len(parts) - len(wanted)))


def _must_cite(item: pytest.Item, rootdir: Path) -> bool:
    path = Path(str(item.path)).resolve()
    if rootdir not in path.parents:
        return False
    rel = path.relative_to(rootdir).as_posix()
    return rel.startswith(_CITING_DIRS)


def _item_problems(item: pytest.Item, known: Mapping[str, object], rootdir: Path) -> list[str]:
    cited = _cited(item)
    problems = []
    unknown = [str(c) for c in cited if c not in known]
    if unknown:
        problems.append(f"{item.nodeid}: unknown clause id(s) {', '.join(unknown)}")
    elif not cited and _must_cite(item, rootdir):
        problems.append(f"{item.nodeid}: cites no clause (add @pytest.mark.spec(...))")
    needed = [c for mark in item.iter_markers("needs") for c in mark.args]
    unknown = [str(c) for c in needed if c not in CAPABILITY_DOCS]
    if unknown:
        problems.append(
            f"{item.nodeid}: needs unknown capability {', '.join(unknown)} "
            f"(the capabilities: {', '.join(CAPABILITY_DOCS)})"
        )
    return problems


def _narrowed_files(config: pytest.Config) -> list[Path]:
    """The files the command line asked for by node id (path::name): only some of their tests were collected."""
    invocation = config.invocation_params.dir
    return [invocation / arg.split("::", 1)[0] for arg in config.args if "::" in arg]


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list[pytest.Item]) -> None:
    known, rootdir = clause_registry.load(), Path(str(config.rootpath)).resolve()
    problems: dict[str, list[str]] = defaultdict(list)
    for item in items:
        for problem in _item_problems(item, known, rootdir):
            problems[item.nodeid.split("::", 1)[0]].append(problem)
        item.user_properties.append(("spec_clauses", _cited(item)))
    expectations_path = config.stash[_TARGET].expectations_path
    entries = expectations.for_version(
        expectations.load(expectations_path), config.stash[_TARGET].version, devices.current()
    )
    path = expectations_path or "(no expectations file)"  # no entries then: it names no problem
    profile = config.stash[_PROFILE]
    randomized = None if settings.get_profile(profile).derandomize else profile
    for problem in expectations.apply(path, entries, items, _cited, randomized, _narrowed_files(config)):
        problems[path].append(problem)
    for item in items:
        entry = item.stash.get(expectations.ENTRY, None)
        if entry is not None:  # recorded with the outcome: the report charges the failure to these clauses only
            charged = EntryRecord(tuple(entry.clauses), entry.verdict, entry.intermittent, entry.severity)
            item.user_properties.append(("spec_entry", charged.to_json()))
    stale = [
        f"{path}: {e.test} [{e.label}] matches no collected test"
        for e in expectations.unmatched(entries, items, rootdir, _narrowed_files(config))
    ]
    if stale and in_ci():
        problems[path].extend([*stale, "(remove or fix these entries; outside CI this is a warning)"])
    elif stale:
        config.stash[_STALE] = stale
        if hasattr(config, "workeroutput"):
            config.workeroutput["ckptspec_stale"] = stale
    if problems:
        _fail_collection(config, items, problems)


def _fail_collection(config: pytest.Config, items: list[pytest.Item], problems: dict[str, list[str]]) -> None:
    """Report each file's problems as a collection error of that file and run nothing.

    A collection report (rather than raising) is what an xdist worker can pass on to the controller.
    """
    for nodeid, lines in problems.items():
        config.hook.pytest_collectreport(report=CollectReport(nodeid, "failed", "ckptspec: " + "\n  ".join(lines), []))
    config.hook.pytest_deselected(items=list(items))
    items[:] = []


@pytest.hookimpl(wrapper=True, tryfirst=True)  # outermost: sees the report after the xfail marks were applied
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A failing test's exception gets a note per cited clause, `[AQ-3] <statement>`, before it is reported; the
    failure's type and text are recorded; an expected failure that fails otherwise than its entry says is reported
    failed (a stale entry, see expectations.failure_problem)."""
    excinfo = call.excinfo
    failure = None
    if call.when == "call" and excinfo is not None and not excinfo.errisinstance(_NOT_FAILURES):
        known = clause_registry.load()
        present = getattr(excinfo.value, "__notes__", [])
        for cid in dict.fromkeys(_cited(item)):
            note = f"[{cid}] {known[cid]['statement']}" if cid in known else f"[{cid}] (unknown clause)"
            if note not in present:
                excinfo.value.add_note(note)
        failure = expectations.describe_failure(excinfo.value)
        item.user_properties.append(("spec_failure", {"type": failure[0][0], "text": failure[1][:2000]}))
        # A failed (or expectedly failing) test may leave a broken queue in its warm ranks, whose close() or __del__
        # can hang a later test there: the next test of the module gets fresh ranks.
        pools = item.funcargs.get("rank_pool") if hasattr(item, "funcargs") else None
        if pools is not None:
            pools.reset()
    report = yield
    entry = item.stash.get(expectations.ENTRY, None)
    if entry is not None and failure is not None and hasattr(report, "wasxfail") and report.skipped:
        problem = expectations.failure_problem(entry, *failure)
        if problem is not None:
            del report.wasxfail
            report.outcome = "failed"
            report.longrepr = f"{problem}\n\n{report.longreprtext}"
    return report


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def target(request: pytest.FixtureRequest) -> Target:
    """The Target under test (picklable: ranks receive its name)."""
    return request.config.stash[_TARGET]


@pytest.fixture
def core(target: Target) -> ModuleType:
    """The target's async_ckpt.core module."""
    return target.module("async_ckpt.core")


@pytest.fixture(autouse=True)
def _end_leaked_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """End the processes a test started in this process and left running, after its teardown; listed in the summary.

    Reported, not failed: the clauses on a worker's lifetime (PC-4, P-EXIT-*, FI-ORPHAN-1) have tests of their own;
    this keeps a target whose workers never exit from filling the machine's memory over a run. Only below
    ckptspec/spec/: the fault suite's audit fails a test for what it leaves, and benchmarks keep workers between tests.
    """
    if not _below(request.node.path, "ckptspec/spec") or launched.active():
        # Launched ranks end what each run or pool left themselves (rank 0's pool workers are its own children).
        yield
        return
    before = reaper.children()
    yield
    leaked = reaper.kill_new_children(before)
    if leaked:
        config = request.config
        config.stash[_REAPED] = config.stash.get(_REAPED, []) + [f"{request.node.nodeid}: {x}" for x in leaked]


@pytest.fixture(scope="module")
def rank_pool() -> Iterator[Callable[..., RankPool]]:
    """rank_pool(world_size) -> a RankPool kept warm for the module, closed at its end."""
    pools: dict[tuple[int, str], RankPool] = {}

    def get(world_size: int, backend: str = "auto") -> RankPool:
        key = (world_size, backend)
        if key not in pools:
            pools[key] = RankPool(world_size, backend)
        return pools[key]

    def reset() -> None:
        """Close every pool: the next get() starts fresh ranks."""
        for pool in pools.values():
            pool.close()
        pools.clear()

    get.reset = reset  # type: ignore[attr-defined]

    yield get
    for pool in pools.values():
        pool.close()


# ---------------------------------------------------------------------------------- reporting


def _outcome(report: pytest.TestReport) -> str | None:
    if hasattr(report, "wasxfail"):
        return "xfail" if report.skipped else "xpass"
    if report.when == "call":
        return report.outcome  # passed | failed | skipped
    if report.failed:
        return "error"
    if report.skipped:
        return "skipped"
    return None


class _Recorder:
    """Collects outcomes on the controller (xdist workers send their reports there)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.records: list[PhaseRecord] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        outcome = _outcome(report)
        if outcome is None or (report.when == "teardown" and outcome != "error"):
            return
        message = ""
        if report.longrepr is not None and outcome in ("failed", "error", "skipped", "xfail"):
            message = str(getattr(report, "wasxfail", "") or report.longreprtext).strip()[-2000:]
        properties: dict[str, Any] = dict(report.user_properties)
        entry = properties.get("spec_entry") if outcome in ("xfail", "xpass") else None
        failure = properties.get("spec_failure") if outcome in ("failed", "error", "xfail") else None
        self.records.append(
            PhaseRecord(
                report.nodeid,
                outcome,
                report.when,
                tuple(properties.get("spec_clauses", [])),
                round(report.duration, 3),
                message,
                None if entry is None else EntryRecord.from_json(entry),
                None if failure is None else FailureRecord.from_json(failure),
            )
        )

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        path = self.config.getoption("--conformance-json")
        if not path:
            return
        target = self.config.stash[_TARGET]
        RunFile(
            target.name,
            target.version,
            clause_registry.load(),
            self.records,
            sorted(target.capabilities),
            self.config.stash[_TENSOR_DEVICE],
            provenance.FORMAT,
            [
                provenance.of_session(
                    target.name,
                    target.version,
                    self.config.stash[_TENSOR_DEVICE],
                    self.config.invocation_params.args,
                    target.expectations_path,
                )
            ],
        ).write(path)

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:  # node: xdist's WorkerController
        """An xdist worker's stale expectation entries and reaped processes (the controller collects nothing);
        for a worker that crashed, what it started and left running, found by its mark."""
        output = getattr(node, "workeroutput", {})
        if output.get("ckptspec_stale"):
            self.config.stash[_STALE] = output["ckptspec_stale"]
        reaped = output.get("ckptspec_reaped", [])
        if error is not None:
            name = node.workerinput["workerid"]
            orphans = reaper.kill_marked(_worker_mark(node.workerinput), reaper.WORKER_MARK)
            reaped = reaped + [f"after xdist worker {name} crashed: {line}" for line in orphans]
        self.config.stash[_REAPED] = self.config.stash.get(_REAPED, []) + reaped

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        for line in self.config.stash.get(_STALE, []):
            terminalreporter.write_line(f"ckptspec: warning: expectations entry {line}", yellow=True)
        for line in self.config.stash.get(_REAPED, []):
            terminalreporter.write_line(f"ckptspec: warning: left running, killed: {line}", yellow=True)
        cited = {c for r in self.records for c in r.clauses}
        uncovered = [c for c in clause_registry.load() if c not in cited]
        if cited and uncovered:
            terminalreporter.write_line(f"ckptspec: clauses not covered by this run: {', '.join(uncovered)}")


@pytest.hookimpl(tryfirst=True)  # before xdist sends the worker's output to the controller
def pytest_sessionfinish(session: pytest.Session) -> None:
    """End what still runs below this process once its tests are done (every background process is reaped).

    Not on an xdist controller, whose children are the workers (each reaps its own).
    """
    config = session.config
    if getattr(config.option, "dist", "no") != "no" and not hasattr(config, "workerinput"):
        return
    keep = reaper.harness_pids()
    reaped = [f"at the end of the session: {line}" for line in reaper.kill_descendants(keep=keep)]
    if mark := os.environ.get(reaper.WORKER_MARK):  # what a test's subprocess left behind, re-parented to init
        reaped += [f"at the end of the session: {line}" for line in reaper.kill_marked(mark, reaper.WORKER_MARK, keep)]
    config.stash[_REAPED] = config.stash.get(_REAPED, []) + reaped
    if hasattr(config, "workeroutput"):
        config.workeroutput["ckptspec_reaped"] = config.stash[_REAPED]
