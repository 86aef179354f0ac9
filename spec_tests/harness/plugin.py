"""The pytest plugin every suite of this project loads (from the root conftest, or `-p spec_tests.harness.plugin`).

- `--impl NAME` (or $CKPTSPEC_IMPL) selects the target; the name is written back to the environment.
- `@pytest.mark.spec("AQ-3", ...)` cites clauses of `spec_tests/clauses/*.toml`. In spec_tests/ (but harness/) and
  fault_injection/ every test must cite at least one; an unknown id is a usage error.
- `@pytest.mark.needs("capability", ...)` skips when the target lacks a capability;
  `@pytest.mark.gpu` skips without CUDA.
- The target's expectations file turns listed tests into strict xfails, with clause and reason.
- `--conformance-json PATH` records every test's outcome with its clauses (see spec_tests.harness.report).
- Hypothesis profiles `ci`, `dev`, `nightly`, chosen by $HYPOTHESIS_PROFILE (default `ci` when $CI
  is set, else `dev`).
"""

from __future__ import annotations

import json
import os
import tomllib
from datetime import timedelta
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

from spec_tests.harness import clauses as clause_registry
from spec_tests.harness.ranks import RankPool
from spec_tests.harness.targets import CAPABILITY_DOCS, ENV_VAR, load_target

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", derandomize=True, database=None, max_examples=10,
                          stateful_step_count=10, deadline=timedelta(seconds=60),
                          suppress_health_check=_SUPPRESS, print_blob=True)
settings.register_profile("dev", max_examples=25, stateful_step_count=15,
                          deadline=timedelta(seconds=60), suppress_health_check=_SUPPRESS)
settings.register_profile("nightly", max_examples=300, stateful_step_count=40, deadline=None,
                          suppress_health_check=_SUPPRESS)

_CITING_DIRS = ("spec_tests", "fault_injection")
_EXEMPT_DIRS = ("spec_tests/harness",)


def pytest_addoption(parser):
    group = parser.getgroup("ckptspec")
    group.addoption("--impl", default=None,
                    help=f"target implementation (default: ${ENV_VAR} or 'impl')")
    group.addoption("--conformance-json", default=None, metavar="PATH",
                    help="write each test's outcome and clauses to PATH")


def pytest_configure(config):
    name = config.getoption("--impl") or os.environ.get(ENV_VAR) or "impl"
    os.environ[ENV_VAR] = name
    config.ckptspec_target = load_target(name)
    profile = os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI") else "dev")
    settings.load_profile(profile)
    config.ckptspec_profile = profile
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_Recorder(config), "ckptspec-recorder")
    for line in ("spec(*ids): clauses of spec_tests/clauses/*.toml that the test checks",
                 "needs(*capabilities): skip unless the target has these capabilities",
                 "gpu: needs a CUDA device"):
        config.addinivalue_line("markers", line)


def pytest_report_header(config):
    target = config.ckptspec_target
    env = {k: v for k, v in os.environ.items() if k.startswith(("CKPTSPEC", "HYPOTHESIS"))}
    return [f"ckptspec target: {target.name} {target.version} "
            f"capabilities: {', '.join(sorted(target.capabilities)) or '-'}",
            f"hypothesis profile: {config.ckptspec_profile}; environment: {env}"]


# ---------------------------------------------------------------------------------- collection


def _cited(item) -> list[str]:
    return [cid for mark in item.iter_markers("spec") for cid in mark.args]


def _must_cite(item, rootdir: Path) -> bool:
    rel = Path(str(item.path)).resolve().relative_to(rootdir).as_posix()
    return rel.startswith(_CITING_DIRS) and not rel.startswith(_EXEMPT_DIRS)


def pytest_collection_modifyitems(session, config, items):
    known, rootdir = clause_registry.load(), Path(str(config.rootpath)).resolve()
    problems = []
    for item in items:
        cited = _cited(item)
        unknown = [c for c in cited if c not in known]
        if unknown:
            problems.append(f"{item.nodeid}: unknown clause id(s) {', '.join(unknown)}")
        elif not cited and _must_cite(item, rootdir):
            problems.append(f"{item.nodeid}: cites no clause (add @pytest.mark.spec(...))")
        item.user_properties.append(("spec_clauses", cited))
        item.user_properties.append(("impl", config.ckptspec_target.name))
    if problems:
        raise pytest.UsageError("clause citations are wrong:\n  " + "\n  ".join(problems))
    _apply_expectations(config, items)


def _apply_expectations(config, items):
    target = config.ckptspec_target
    path = target.expectations_path
    entries = tomllib.loads(Path(path).read_text()).get("xfail", []) if path else []
    for entry in entries:
        test, clause, reason = entry["test"], entry["clause"], entry["reason"]
        matched = [i for i in items if i.nodeid == test or i.nodeid.startswith(test + "[")]
        for item in matched:
            if clause not in _cited(item):
                raise pytest.UsageError(f"{path}: {test} does not cite clause {clause}")
            item.add_marker(pytest.mark.xfail(strict=True, reason=f"[{clause}] {reason}"))


def pytest_runtest_setup(item):
    target = item.config.ckptspec_target
    for mark in item.iter_markers("needs"):
        missing = [c for c in mark.args if not target.has(c)]
        if missing:
            docs = "; ".join(f"{c}: {CAPABILITY_DOCS.get(c, '?')}" for c in missing)
            pytest.skip(f"target {target.name!r} lacks {docs}")
    if item.get_closest_marker("gpu"):
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device; this machine has none")


# ------------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="session")
def target(request):
    """The Target under test (picklable: ranks receive its name)."""
    return request.config.ckptspec_target


@pytest.fixture
def core(target):
    """The target's async_ckpt.core module."""
    return target.module("async_ckpt.core")


@pytest.fixture(scope="module")
def rank_pool():
    """rank_pool(world_size) -> a RankPool kept warm for the module, closed at its end."""
    pools: dict[tuple, RankPool] = {}

    def get(world_size: int, backend: str = "auto") -> RankPool:
        key = (world_size, backend)
        if key not in pools:
            pools[key] = RankPool(world_size, backend)
        return pools[key]

    yield get
    for pool in pools.values():
        pool.close()


# ---------------------------------------------------------------------------------- reporting


def _outcome(report) -> str | None:
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

    def __init__(self, config):
        self.config, self.records = config, []

    def pytest_runtest_logreport(self, report):
        outcome = _outcome(report)
        if outcome is None or (report.when == "teardown" and outcome != "error"):
            return
        message = ""
        if report.longrepr is not None and outcome in ("failed", "error", "skipped", "xfail"):
            message = str(getattr(report, "wasxfail", "") or report.longreprtext).strip()[-2000:]
        self.records.append({
            "nodeid": report.nodeid, "outcome": outcome, "when": report.when,
            "clauses": dict(report.user_properties).get("spec_clauses", []),
            "duration": round(report.duration, 3), "message": message})

    def pytest_sessionfinish(self, session):
        path = self.config.getoption("--conformance-json")
        if not path:
            return
        target = self.config.ckptspec_target
        payload = {"target": target.name, "version": target.version,
                   "capabilities": sorted(target.capabilities),
                   "clauses": clause_registry.load(), "tests": self.records}
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(payload, indent=1, sort_keys=True))

    def pytest_terminal_summary(self, terminalreporter):
        cited = {c for r in self.records for c in r["clauses"]}
        uncovered = [c for c in clause_registry.load() if c not in cited]
        if cited and uncovered:
            terminalreporter.write_line(
                f"ckptspec: clauses not covered by this run: {', '.join(uncovered)}")
