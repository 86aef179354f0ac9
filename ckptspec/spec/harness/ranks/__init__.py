"""Running a test body on N ranks: the runner seam, the forked runner, the launched runner, and what they leave.

Modules:
    vocabulary     what every runner shares: per-rank state, outcomes, the RankFailures report, a job, the Runner protocol
    seam           the runner in use (`use_runner`, chosen once) and what tests call: `ranks`, `run_on_ranks`, `RankPool`
    forked         the default Runner: ranks forked from a forkserver, bounded, every rank reported
    launched       under torchrun: rank 0 drives the session and the bodies run on the launched ranks
    launched_rank  what a launched rank does with one body (process group, pool state, stop requests)
    loopback       several torchrun "nodes" on this machine; comparing the verdicts of two runs
    reaper         ending what the ranks started, and whatever outlives a pytest session
    fork_safety    whether ranks forked after importing the target can still use CUDA (what the forkserver preloads)
    devices        where the trainer's tensors live (`--tensor-device`) and how many GPUs a run may use

A test imports these names from this package (`from ckptspec.spec.harness.ranks import world`); each is imported from
its module on first use, so that the vocabulary imports without a runner.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ckptspec.spec.harness.ranks.seam import RankPool, ranks, resolve_backend, run_on_ranks, use_runner
    from ckptspec.spec.harness.ranks.vocabulary import RankFailures, rank_state, world

__all__ = ["RankFailures", "RankPool", "rank_state", "ranks", "resolve_backend", "run_on_ranks", "use_runner", "world"]
_HOMES = {
    **dict.fromkeys(("RankPool", "ranks", "resolve_backend", "run_on_ranks", "use_runner"), "seam"),
    **dict.fromkeys(("RankFailures", "rank_state", "world"), "vocabulary"),
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)
