"""LM-10: save(tasd, i) is refused (CheckpointingException, nothing written or removed) unless i is newer than the
newest complete checkpoint in storage, and when i is negative.

Shown on NVRx 0.4.1 and 0.7.0 (same manager code). BaseCheckpointManager.save asserts that the iteration is newer
than the latest one: assert self.latest_iteration < iteration, "A newer checkpoint is already available".

That assert compares with the cached latest_iteration, which save() itself resets to -1 (and its finalize_fn
again, after find_latest()): after save(5) the cache is -1, so save(5) and save(3) are accepted and written (the
finalize only logs that a newer checkpoint exists, then cleans up older ones), save(-1) fails with a bare
AssertionError, and a new manager (cache -1 too) accepts save(4).

    python LM-10.py nvidia_resiliency_ext | impl
"""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common
import torch

BOUND_S = 30


def _listing(root: str) -> list:
    return sorted(
        (os.path.relpath(os.path.join(d, f), root), os.path.getsize(os.path.join(d, f)))
        for d, _, fs in os.walk(root)
        for f in fs
    )


def _body(rank: int, world: int, tmp: str) -> dict:
    local = _common.module("local.ckpt_managers.local_manager")
    root = os.path.join(tmp, f"node{rank}")  # each rank's node-local storage

    def state(iteration: int):
        return _common.CpuStateDict({"w": torch.full((4,), 10.0 * iteration + rank), "step": iteration})

    manager = local.LocalCheckpointManager(root)
    manager.save(state(5), 5)
    before = _listing(root)
    seen = {}
    for label, mgr, iteration in (("save(5)", manager, 5), ("save(3)", manager, 3), ("save(-1)", manager, -1)):
        seen[label] = _common.outcome(BOUND_S, mgr.save, state(iteration), iteration)
    seen["new manager's save(4)"] = _common.outcome(BOUND_S, local.LocalCheckpointManager(root).save, state(4), 4)
    return {"saves": seen, "files before": before, "files after": _listing(root)}


def main() -> None:
    with _common.scratch() as tmp:
        results = _common.run_ranks(_body, tmp, timeout_s=120)
    if any(how != "returned" for how, _ in results.values()):
        _common.setup_failed(results)
    broken = False
    for rank, (_, got) in results.items():
        print(f"rank {rank}, after save(5): {got['saves']}")
        if got["files after"] != got["files before"]:
            print(f"  its storage changed: {got['files before']} -> {got['files after']}")
        refused = all(v.startswith("CheckpointingException") for v in got["saves"].values())
        broken |= not refused or got["files after"] != got["files before"]
    _common.verdict(broken, "each save above should raise CheckpointingException and leave the storage unchanged")


if __name__ == "__main__":
    main()
