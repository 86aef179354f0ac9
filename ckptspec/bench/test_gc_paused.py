"""impl pauses automatic garbage collection in the trainer's calls of a save (ckptspec/impl/utils.py `paused_gc`):
planning, scheduling and the finalize run no collection (but the one of the youngest generation that may start as
a call returns), so the objects a call makes and drops are freed before
any collection sees them (at 10,000 tensors a save otherwise brought a full collection of the trainer's process,
0.4-0.5 s on the 2-core machine, every one or two saves), and collection is as it was once the calls return. The
contract no spec clause states: the clauses judge what a save writes, not what the trainer's heap pays for it."""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultSavePlanner

from ckptspec.impl.utils import paused_gc
from ckptspec.spec.harness import load_target
from ckptspec.spec.harness.surface.recipe import planned_save, recipe_modules

_IMPL = load_target("impl")
_MODULES = recipe_modules(_IMPL)
_SDS = _IMPL.module("async_ckpt.state_dict_saver")
_TENSORS = 1_000  # some 5,000 objects made per call: well past the 700 allocations that start a collection


@contextmanager
def _collections() -> Iterator[list[int]]:
    """The generations of the automatic collections that start inside the block."""
    seen: list[int] = []
    # Counts reset: a collection the caller's own allocations have made due would otherwise start at the call's
    # first allocation, before the call pauses collection.
    gc.collect()

    def note(phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            seen.append(info["generation"])

    gc.callbacks.append(note)
    try:
        yield seen
    finally:
        gc.callbacks.remove(note)


def test_a_saves_trainer_calls_run_no_collection(tmp_path):
    state = {"model": {f"t{i}": torch.randn(4) for i in range(_TENSORS)}, "step": 1}
    cache = _SDS.CheckpointMetadataCache()
    queue = _MODULES.core.AsyncCallsQueue(persistent=True)
    assert gc.isenabled(), "the test needs automatic collection on"
    try:
        for k in range(2):  # planned in full, then prepared
            writer = _MODULES.writers.FileSystemWriterAsync(str(tmp_path / f"c{k}"), thread_count=1)
            with _collections() as in_plan:
                ret = _SDS.save_state_dict_async_plan(
                    state, writer, planner=DefaultSavePlanner(), enable_cache=True, metadata_cache=cache
                )
            planned = planned_save(_MODULES, writer, ret)
            with _collections() as in_schedule:
                queue.schedule_async_request(planned.but(finalize_fn=lambda: None).request())
            queue.maybe_finalize_async_calls(blocking=True, no_dist=True)  # the write, done (its wait polls)
            with _collections() as in_finalize:
                planned.finalize_fn()
            # At most the one collection of the youngest generation that the objects a call keeps make due as
            # collection comes back, when the call returns.
            assert all(seen in ([], [0]) for seen in (in_plan, in_schedule, in_finalize)), (
                f"save {k}: collections (by generation) ran inside planning {in_plan}, scheduling {in_schedule}, "
                f"finalize {in_finalize}"
            )
            assert gc.isenabled(), f"save {k}: automatic collection is off after the trainer's calls"
            assert (tmp_path / f"c{k}" / ".metadata").exists()
    finally:
        queue.close()


def _in_thread(fn: Callable[[], None]) -> threading.Thread:
    thread = threading.Thread(target=fn)
    thread.start()
    return thread


def test_paused_blocks_nest_across_threads_and_restore_what_they_found():
    entered, leave = threading.Event(), threading.Event()

    def other() -> None:
        with paused_gc():
            entered.set()
            leave.wait(timeout=30)

    assert gc.isenabled()
    thread = _in_thread(other)
    try:
        assert entered.wait(timeout=30), "the other thread never entered its block"
        with paused_gc():
            assert not gc.isenabled()
        assert not gc.isenabled(), "collection came back while another thread's block was still running"
    finally:
        leave.set()
        thread.join(timeout=30)
    assert not thread.is_alive()
    assert gc.isenabled(), "collection stayed off after every block ended"
    gc.disable()
    try:
        with paused_gc():
            pass
        assert not gc.isenabled(), "a block turned on collection that was off before it"
    finally:
        gc.enable()


def test_a_block_entered_from_inside_another_blocks_steps_leaves_collection_right(monkeypatch):
    """A signal handler that saves (a save on SIGTERM) runs in the thread it interrupts, maybe in the middle of
    paused_gc's own steps: a block entered there neither waits for the lock the thread holds nor leaves collection
    off. Simulated by entering a block from inside the first block's call to gc.disable."""
    real_disable = gc.disable
    nested: list[str] = []

    def disable_with_a_handler_inside() -> None:
        if not nested:
            nested.append("entered")
            with paused_gc():
                nested.append("inside")
        real_disable()

    monkeypatch.setattr(gc, "disable", disable_with_a_handler_inside)
    outcome: list[bool] = []

    def run() -> None:
        with paused_gc():
            outcome.append(gc.isenabled())
        outcome.append(gc.isenabled())

    thread = threading.Thread(target=run, daemon=True)  # daemon: a deadlocked one must not hold the run open
    thread.start()
    thread.join(timeout=30)
    assert not thread.is_alive(), "a block entered while the thread held paused_gc's lock waited for it (deadlock)"
    assert nested == ["entered", "inside"]
    assert outcome == [False, True], f"collection (on, after) was {outcome}, expected off inside and on after"
