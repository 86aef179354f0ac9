"""The harness: everything the suites share, and nothing that knows a clause area or a target's internals.

Sub-packages (one job each; each one's __init__ lists its modules):
    ranks       running a body on N ranks: the Runner seam and its vocabulary, the forked runner (the default), the
                launched runner, the reaper
    surface     the target surface (the harness's side of an adapter): loading a target, the adapter contract,
                the protocol layer (`saver_api`) and the manager contract layer (`manager_api`), formats, the
                documented recipe

Modules beside them:
    plugin      the pytest plugin (--impl, spec/needs/gpu markers, expectations, conformance JSON)
    applicability  which tests apply to the target: the plugin's skips (capabilities, GPU, "not applicable")
    profiles    the hypothesis profiles (ci, explore, nightly) and which one a run loads
    ci_job      the conformance workflow's job: run the suite against an adapter, summarise it
    expectations  a target's known failures (its expectations file), read by the plugin and record_failures
    record_failures  expectations entries (`raises`, `match`) written from a recorded run
    asserts     bounded calls and their outcomes; the assertion family (one message shape)
    processes   the async core and its callers; observing processes and files from outside; cleaning up
    warm_savers one saver kept warm on a rank across the examples of a property test (kept, end_kept)
    shared_runs one run shared by a strict test and its weak test
    workloads   small state dicts and functions run by requests
    strategies  hypothesis strategies for state dicts and tensors
    s3          an S3 endpoint on loopback with a fault proxy, and its fixture (moto is imported on demand)
    machines    running hypothesis state machines (imported on demand: it needs hypothesis)

Recorded runs and everything that reads them (the run record the plugin writes, verdicts, pages, the release list,
the clause registry) are `ckptspec.report`, torch-free, below the harness; the `ckptspec` command is `ckptspec.cli`.

The import rule, the same for every file (CONTRIBUTING.md, "Layers"): the harness is the bottom layer (it imports
no target, driver or test); above it, code imports this package's names below or a harness module's public names,
never a private (underscored) name of another package and never a test module. import-linter's contracts in
pyproject.toml check the layers; harness_tests/test_import_rules.py checks the names.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptspec.spec.harness.asserts import (
        HUNG,
        BoundExceeded,
        Outcome,
        assert_each_rank,
        assert_equal,
        assert_state_dict_equal,
        attempt,
        bounded,
        outcome_of,
    )
    from ckptspec.spec.harness.processes import CALLERS, alive, async_core, close_quietly, exists, remove, wait_for_file
    from ckptspec.spec.harness.ranks import RankFailures, RankPool, rank_state, run_on_ranks, world
    from ckptspec.spec.harness.surface.loading import MissingCapability, Target, current_target, load_target

__all__ = [
    "CALLERS",
    "HUNG",
    "BoundExceeded",
    "MissingCapability",
    "Outcome",
    "RankFailures",
    "RankPool",
    "Target",
    "alive",
    "assert_each_rank",
    "assert_equal",
    "assert_state_dict_equal",
    "async_core",
    "attempt",
    "bounded",
    "close_quietly",
    "current_target",
    "exists",
    "load_target",
    "outcome_of",
    "rank_state",
    "remove",
    "run_on_ranks",
    "wait_for_file",
    "world",
]


# Where each public name lives. The names are imported on first use (PEP 562), so that the modules that read stored
# runs (report, findings, releases...) import without torch: `ckptspec report` in an environment without it.
_HOMES = {
    **dict.fromkeys(
        (
            "HUNG",
            "BoundExceeded",
            "Outcome",
            "assert_each_rank",
            "assert_equal",
            "assert_state_dict_equal",
            "attempt",
            "bounded",
            "outcome_of",
        ),
        "asserts",
    ),
    **dict.fromkeys(
        ("CALLERS", "alive", "async_core", "close_quietly", "exists", "remove", "wait_for_file"), "processes"
    ),
    **dict.fromkeys(("RankFailures", "RankPool", "rank_state", "run_on_ranks", "world"), "ranks"),
    **dict.fromkeys(("MissingCapability", "Target", "current_target", "load_target"), "surface.loading"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
