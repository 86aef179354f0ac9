"""LM-11: find_latest() with other replication parameters than the save's raises CheckpointingException on every
rank, naming the mismatch, and removes nothing.

Shown on NVRx 0.4.1 and 0.7.0 (same manager code). 001, local checkpointing requirements: "the replication
parameters (i.e. `world_size`, `--replication-jump` and `--replication-factor`) must be the same as during save".

The parts' file names and ids hold only iteration, rank and session: the replication parameters are neither
recorded at save nor checked at load. find_latest() all-gathers the ids each rank holds and takes an iteration as
complete when every rank's part is held somewhere (its own TODO notes that parameters that changed since the save
are not filtered), so after a save with replication jump 1 and factor 2 on 4 ranks, managers with jump 2 report
the checkpoint as complete.

    python LM-11.py nvidia_resiliency_ext | impl
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common
import torch

BOUND_S = 30


def _listing(root: str) -> list:
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def _body(rank: int, world: int, tmp: str) -> dict:
    strategies = _common.module("local.replication.strategies")
    local = _common.module("local.ckpt_managers.local_manager")
    _common.cpu_replica_transfers()
    base = _common.module("local.ckpt_managers.base_manager")
    root = os.path.join(tmp, f"node{rank}")  # each rank's node-local storage
    saved_with = strategies.CliqueReplicationStrategy.from_replication_params(1, 2)
    other = strategies.CliqueReplicationStrategy.from_replication_params(2, 2)
    state = _common.CpuStateDict({"w": torch.full((4,), 10.0 * rank), "step": 6})
    local.LocalCheckpointManager(root, repl_strategy=saved_with).save(state, 6)
    before = _listing(root)
    found = {}

    def find_latest() -> None:
        try:
            found["returned"] = local.LocalCheckpointManager(root, repl_strategy=other).find_latest()
        except base.CheckpointingException as exc:
            found["names replication"] = "replication" in str(exc).lower()
            raise

    seen = _common.outcome(BOUND_S, find_latest).split(":")[0]
    return {"find_latest": found.get("returned", seen), **found, "storage unchanged": before == _listing(root)}


def main() -> None:
    with _common.scratch() as tmp:
        results = _common.run_ranks(_body, tmp, world=4, timeout_s=180)
    if any(how != "returned" for how, _ in results.values()):
        _common.setup_failed(results)
    broken = False
    for rank, (_, got) in results.items():
        print(f"rank {rank}: find_latest() with jump 2 after a save of iteration 6 with jump 1: {got}")
        broken |= got != {"find_latest": "CheckpointingException", "names replication": True, "storage unchanged": True}
    _common.verdict(broken, "find_latest() should raise CheckpointingException naming the replication parameters")


if __name__ == "__main__":
    main()
