"""impl writes as it copies (ckptspec/impl/async_ckpt/staging.py, "Landing"): the checks of its contract that no spec
clause states, for the figures these benchmarks time. The snapshot and the files themselves are the spec's (P-SNAP-1,
FS-18, IN-1: unchanged).

- A request reaches the worker before its tensors are copied where the copies leave the writer a core (a GPU's, or
  fewer trainer threads than cores), after them otherwise; the call returns only after every copy.
- The worker's writer waits for each tensor's bytes, and for no more: a tensor that has landed is written while the
  next is still being copied; a failed copy fails the wait instead of writing what is there.
- The writer's host-copy preload never reaches the worker: the trainer stages its tensors with the rest, CUDA ones
  into the pinned slab (a side stream, one event per group of copies), and scheduling returns once they have landed.
"""

from __future__ import annotations

import functools
import os
import sys
import threading
from typing import Any

import pytest
import torch

from ckptspec.bench.peers import plan_write
from ckptspec.bench.snapshot_saves import saves_then_changes
from ckptspec.spec.harness import load_target
from ckptspec.spec.harness.asserts import bounded

BOUND = 120.0


def _staging() -> Any:
    """impl's staging module, reached through its target adapter (the suite reaches impl only that way)."""
    queue = load_target("impl").module("async_ckpt.core").AsyncCallsQueue()
    module = sys.modules[type(queue._get_async_caller()).__module__]  # callers
    return sys.modules[module.__name__.rsplit(".", 1)[0] + ".staging"]


def _request(tensors: dict[str, torch.Tensor]) -> Any:
    core = load_target("impl").module("async_ckpt.core")
    return core.AsyncRequest(async_fn=print, async_fn_args=(0, tensors), finalize_fns=[])


def test_the_worker_waits_for_each_tensor_and_no_longer(tmp_path):
    staging = _staging()
    pool = staging.SlabPool()
    first, second = torch.arange(1000.0), torch.arange(1000.0, 3000.0)
    request, slab, layout = staging.lay_out(_request({"a": first, "b": second}), pool)
    slab.set_progress(0)
    unstaged = staging.unstage(request, (os.dup(slab.fd), slab.nbytes))
    a, b = unstaged.async_fn_args[1]["a"], unstaged.async_fn_args[1]["b"]
    landed = {"a": threading.Event(), "b": threading.Event()}

    def writer() -> None:
        staging.wait_landed(a)
        landed["a"].set()
        staging.wait_landed(b)
        landed["b"].set()

    thread = threading.Thread(target=writer, daemon=True)
    thread.start()
    assert not landed["a"].wait(0.2), "the writer went on before anything landed"
    (t0, place0), (t1, place1) = layout
    slab.write(place0, t0)
    slab.set_progress(place0.offset + place0.numel * 4)
    assert landed["a"].wait(BOUND), "the first tensor landed but the writer still waits for it"
    assert torch.equal(a, first)
    assert not landed["b"].wait(0.2), "the writer read the second tensor before it landed"
    slab.write(place1, t1)
    slab.set_progress(staging.LANDED_ALL)
    assert landed["b"].wait(BOUND)
    assert torch.equal(b, second)
    thread.join(BOUND)
    pool.give(slab)
    pool.clear()


def test_a_failed_copy_fails_the_wait_instead_of_writing_what_is_there():
    staging = _staging()
    pool = staging.SlabPool()
    request, slab, _ = staging.lay_out(_request({"a": torch.ones(10)}), pool)
    slab.set_progress(staging.COPY_FAILED)
    unstaged = staging.unstage(request, (os.dup(slab.fd), slab.nbytes))
    with pytest.raises(RuntimeError, match="copy of the snapshot"):
        staging.wait_landed(unstaged.async_fn_args[1]["a"])
    pool.give(slab)
    pool.clear()


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


@pytest.mark.parametrize("threads", ["one", "every core"])
def test_a_request_is_sent_before_its_copies_only_where_they_leave_the_writer_a_core(tmp_path, monkeypatch, threads):
    """Host copies use the trainer's torch threads: with fewer threads than cores the request goes to the worker
    before its copies (it writes as they land); with a thread on every core, after them (a writer sharing the
    copy's cores slows it). Either way the call returns after every copy."""
    if threads == "one" and _cores() == 1:
        pytest.skip("one core: no thread count leaves the writer a core")
    before = torch.get_num_threads()
    torch.set_num_threads(1 if threads == "one" else _cores())
    try:
        events = _schedule_events(tmp_path, monkeypatch)
    finally:
        torch.set_num_threads(before)
    if threads == "one":
        assert events[-3:] == ["send", "copies begin", "copies end"], events
    else:
        assert events[-3:] == ["copies begin", "copies end", "send"], events


def _schedule_events(tmp_path, monkeypatch) -> list[str]:
    """The order of the request's sending and its copies in one save through impl's default queue."""
    queue = load_target("impl").module("async_ckpt.core").AsyncCallsQueue()
    caller = queue._get_async_caller()
    callers = sys.modules[type(caller).__module__]
    events: list[str] = []
    real_send, real_copy_in = caller._send, callers.copy_in

    def send(message, fd=None):
        events.append("send")
        return real_send(message, fd)

    def copy_in(slab, layout):
        events.append("copies begin")
        real_copy_in(slab, layout)
        events.append("copies end")

    monkeypatch.setattr(caller, "_send", send)
    monkeypatch.setattr(callers, "copy_in", copy_in)
    state = {"w": torch.randn(1 << 16), "step": 3}
    try:
        queue.schedule_async_request(plan_write("impl", state, str(tmp_path / "c")).request())
        scheduled = list(events)  # what happened by the time scheduling returned
        bounded(BOUND, "maybe_finalize_async_calls(blocking=True)", queue.maybe_finalize_async_calls, True)
    finally:
        bounded(BOUND, "close()", queue.close)
    return scheduled


def _with_the_writers_preload(planned: Any) -> Any:
    """The planned save with the writer's host-copy preload, as the writer makes it for CUDA tensors."""
    writer = planned.writer
    return planned.but(preload_fn=functools.partial(type(writer).preload_tensors, writer.write_buckets))


def test_the_writers_host_copy_preload_is_staged_by_the_trainer(tmp_path, monkeypatch):
    """The writer's preload (its tensors copied to host, marked `copies_to_host`) never reaches the worker: the
    trainer stages its argument with the rest and scheduling waits for no acknowledgement from the worker (before
    issue 62 the worker ran it on CUDA tensors received through IPC handles). CPU tensors here, the preload made as
    the writer makes it for CUDA ones; the CUDA copies themselves are the GPU test's below."""
    queue = load_target("impl").module("async_ckpt.core").AsyncCallsQueue()
    caller = queue._get_async_caller()
    acknowledgements: list[int] = []
    real_wait = caller._wait_for_preload

    def wait_for_preload(idx: int) -> None:
        acknowledgements.append(idx)
        real_wait(idx)

    monkeypatch.setattr(caller, "_wait_for_preload", wait_for_preload)
    try:
        problems = saves_then_changes(queue, tmp_path, "cpu", 2, prepare=_with_the_writers_preload)
    finally:
        bounded(BOUND, "close()", queue.close)
    assert not problems, problems
    assert not acknowledgements, f"scheduling waited for the worker's preload of requests {acknowledgements}"


@pytest.mark.gpu  # skips without CUDA (the spec plugin); run by the GPU stages impl-gpu and impl-overlapped-lease
def test_default_cuda_saves_are_staged_by_the_trainer_into_a_pinned_slab(tmp_path):
    """The default (not overlapped) queue with CUDA tensors: scheduling returns once their device-to-host copies
    into the pinned slab have landed, so the checkpoint holds the values at the call; one slab is reused."""
    queue = load_target("impl").module("async_ckpt.core").AsyncCallsQueue(persistent=True)
    try:
        problems = saves_then_changes(queue, tmp_path, "cuda", 3)
        assert not problems, problems
        free = queue._get_async_caller()._pool._free
        assert len(free) == 1, f"{len(free)} slabs kept after 3 saves of one size"
        assert free[0].pinned, "the CUDA tensors' slab is not page-locked"
    finally:
        bounded(BOUND, "close()", queue.close)
