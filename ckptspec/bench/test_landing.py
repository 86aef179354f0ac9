"""impl writes as it copies (ckptspec/impl/async_ckpt/staging.py, "Landing"): the checks of its contract that no spec
clause states, for the figures these benchmarks time. The snapshot and the files themselves are the spec's (P-SNAP-1,
FS-18, IN-1: unchanged).

- A request reaches the worker before its tensors are copied, and the call still returns only after every copy.
- The worker's writer waits for each tensor's bytes, and for no more: a tensor that has landed is written while the
  next is still being copied; a failed copy fails the wait instead of writing what is there.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import pytest
import torch

from ckptspec.bench.peers import plan_write
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


def test_a_request_is_sent_before_its_copies_and_the_call_returns_after_them(tmp_path, monkeypatch):
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
        assert events[-3:] == ["send", "copies begin", "copies end"], events
        bounded(BOUND, "maybe_finalize_async_calls(blocking=True)", queue.maybe_finalize_async_calls, True)
    finally:
        bounded(BOUND, "close()", queue.close)
