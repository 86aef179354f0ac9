"""The harness: everything the suites share, and nothing that knows a clause area or a target's internals.

Modules (one concept each):
    targets     Target, adapters, capabilities; how every process resolves the same target
    clauses     the clause registry (spec_tests/clauses/*.toml)
    plugin      the pytest plugin (--impl, spec/needs/gpu markers, expectations, conformance JSON)
    ranks       the multi-rank runner (run a body on N ranks, with a bound and a report of every rank)
    processes   observing processes and files from outside (alive, exists, wait_for_file)
    asserts     the assertion family (bounded waits, state-dict equality)
    report      the conformance table and the print-or-update helpers
    workloads   small state dicts and functions run by requests
    strategies  hypothesis strategies for state dicts and tensors
    s3          an S3 endpoint on loopback with a fault proxy (imported on demand: it needs moto)

fault_injection/ and benchmarks/ import the names below from here, never from a test module.
"""

from spec_tests.harness.asserts import assert_state_dict_equal, bounded
from spec_tests.harness.processes import alive, exists, wait_for_file
from spec_tests.harness.ranks import RankFailures, RankPool, rank_state, ranks, run_on_ranks, world
from spec_tests.harness.report import ReportError, cell, load_run, update_file, write_block
from spec_tests.harness.targets import MissingCapability, Target, current_target, load_target

__all__ = [
    "MissingCapability", "RankFailures", "RankPool", "ReportError", "Target", "alive", "assert_state_dict_equal",
    "bounded", "cell", "current_target", "exists", "load_run", "load_target", "rank_state", "ranks",
    "run_on_ranks", "update_file", "wait_for_file", "world", "write_block",
]
