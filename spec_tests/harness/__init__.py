"""The harness: everything the suites share, and nothing that knows a clause area or a target's internals.

Modules (one concept each):
    targets     Target, adapters, capabilities; how every process resolves the same target
    clauses     the clause registry (spec_tests/clauses/*.toml)
    plugin      the pytest plugin (--impl, spec/needs/gpu markers, expectations, conformance JSON)
    profiles    the hypothesis profiles (ci, explore, nightly) and which one a run loads
    rank_runs   the vocabulary of a rank run (outcomes, the RankFailures report, per-rank state, the Runner seam)
    fork_safety whether ranks forked after importing the target can still use CUDA (what the forkserver preloads)
    ranks       the multi-rank runner (run a body on N forked ranks, with a bound and a report of every rank)
    launched    under torchrun: rank 0 drives the session and the bodies run on the launched ranks
    launched_rank  what a launched rank does with one body (process group, pool state, stop requests)
    loopback    several torchrun "nodes" on this machine; comparing the verdicts of two runs
    recipe      the documented async save recipe (plan_async_save), written once for every caller
    processes   the async core and its callers; observing processes and files from outside; cleaning up
    warm_savers one saver kept warm on a rank across the examples of a property test (kept, end_kept)
    asserts     bounded calls and their outcomes; the assertion family (one message shape)
    runs        recorded runs (conformance JSON) read back, and the command that makes one
    verdicts    verdict words: what a run says about a clause
    report      the conformance table (clause x target) and its command line (also --html: results_page)
    results_page  the filterable HTML page of every clause against every run (docs/results.html)
    findings    docs/findings/<target>-<release>.md: what a release breaks, by severity
    blocks      the generated blocks of Markdown files (print or update between marker lines)
    workloads   small state dicts and functions run by requests
    strategies  hypothesis strategies for state dicts and tensors
    s3          an S3 endpoint on loopback with a fault proxy, and its fixture (moto is imported on demand)
    machines    running hypothesis state machines (imported on demand: it needs hypothesis)

The import rule, the same for every file (CONTRIBUTING.md, "Layers"): the harness is the bottom layer (it imports
no target, driver or test); above it, code imports this package's names below or a harness module's public names,
never a private (underscored) name of another package and never a test module. import-linter's contracts in
pyproject.toml check the layers; harness_tests/test_import_rules.py checks the names.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spec_tests.harness.asserts import (
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
    from spec_tests.harness.blocks import update_file, write_block
    from spec_tests.harness.processes import CALLERS, alive, async_core, close_quietly, exists, remove, wait_for_file
    from spec_tests.harness.ranks import RankFailures, RankPool, rank_state, ranks, run_on_ranks, world
    from spec_tests.harness.runs import Record, ReportError, load_run
    from spec_tests.harness.targets import MissingCapability, Target, current_target, load_target

__all__ = [
    "CALLERS",
    "HUNG",
    "BoundExceeded",
    "MissingCapability",
    "Outcome",
    "RankFailures",
    "RankPool",
    "Record",
    "ReportError",
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
    "load_run",
    "load_target",
    "outcome_of",
    "rank_state",
    "ranks",
    "remove",
    "run_on_ranks",
    "update_file",
    "wait_for_file",
    "world",
    "write_block",
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
    **dict.fromkeys(("update_file", "write_block"), "blocks"),
    **dict.fromkeys(
        ("CALLERS", "alive", "async_core", "close_quietly", "exists", "remove", "wait_for_file"), "processes"
    ),
    **dict.fromkeys(("RankFailures", "RankPool", "rank_state", "ranks", "run_on_ranks", "world"), "ranks"),
    **dict.fromkeys(("Record", "ReportError", "load_run"), "runs"),
    **dict.fromkeys(("MissingCapability", "Target", "current_target", "load_target"), "targets"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
