"""Saves of one state dict on one of impl's queues, each changed in place as soon as the trainer may change it,
and what each checkpoint then holds: the snapshot check of impl's own staging tests (test_landing.py,
test_overlap.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from ckptspec.bench.peers import plan_write
from ckptspec.spec.harness.asserts import bounded

__all__ = ["BIG", "saves_then_changes"]

BIG = 1 << 20  # elements of the large tensor: its copy is still running when the small one's is done
BOUND_S = 120.0  # seconds for a save, the first of which starts the worker


def _state(device: str, version: int) -> dict[str, Any]:
    return {
        "big": torch.arange(BIG, dtype=torch.float32, device=device) + version,
        "small": torch.full((7,), float(version), device=device),
        "step": version,
    }


def saves_then_changes(
    queue: Any,
    root: Any,
    device: str,
    saves: int,
    *,
    wait_for_staging: bool = False,
    prepare: Callable[[Any], Any] | None = None,
) -> list[str]:
    """`saves` saves through `queue` into folders of `root`, each of the values of its version, the tensors then
    changed in place once scheduling returned (and `wait_for_staging()`, where asked); each checkpoint is loaded
    with stock `dcp.load` and every difference from its version's values is returned. `prepare`: applied to each
    planned save before its request is made (`PlannedSave.but`)."""
    state, problems = _state(device, 0), []
    for version in range(saves):
        path = str(root / f"c{version}")
        state["step"] = version
        planned = plan_write("impl", state, path)
        queue.schedule_async_request((prepare(planned) if prepare else planned).request())
        if wait_for_staging:
            queue.wait_for_staging()
        for key in ("big", "small"):
            state[key].add_(1)  # the next training step; the checkpoint must hold the values before it
        bounded(BOUND_S, "maybe_finalize_async_calls(blocking=True)", queue.maybe_finalize_async_calls, True)
        loaded: dict = {"big": torch.empty(BIG), "small": torch.empty(7), "step": -1}
        dcp.load(loaded, checkpoint_id=path, no_dist=True)
        want = _state("cpu", version)
        problems += [f"save {version}: {k} differs" for k in ("big", "small") if not torch.equal(loaded[k], want[k])]
        if loaded["step"] != version:
            problems.append(f"save {version}: step {loaded['step']}")
    return problems
