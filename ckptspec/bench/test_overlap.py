"""impl's overlapped staging (`AsyncCallsQueue(overlap_staging=True)`, ckptspec/impl/async_ckpt/overlap.py): the checks of its
contract that no spec clause states, for the `dcp:impl-overlapped` peer these benchmarks time.

- Snapshot: once `wait_for_staging()` returns, the trainer may change the tensors: each checkpoint holds the values
  they had at the call (CPU here; CUDA tensors, with and without the device clone, on a GPU).
- Memory: saves of one size reuse one slab (the pool holds it between saves; nothing else stays), a state dict that
  changes size leaves no slab per size (the pool is bounded), CUDA slabs are page-locked once, and `close()` frees
  the pool.
- Arguments: overlapped staging needs a persistent queue; the device clone needs overlapped staging.

The spec's own snapshot family runs on the overlapped mode with `CKPTSPEC_IMPL_STAGING=overlapped` (docs/impl.md).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ckptspec.bench.peers import plan_write
from ckptspec.bench.snapshot_saves import BIG, saves_then_changes
from ckptspec.spec.harness import load_target
from ckptspec.spec.harness.asserts import bounded

BOUND = 120.0  # seconds for a save, the first of which starts the worker


def _queue(**options: Any) -> Any:
    """impl's AsyncCallsQueue (through its target adapter, as the suite reaches impl)."""
    return load_target("impl").module("async_ckpt.core").AsyncCallsQueue(**options)


def _saves_then_changes(tmp_path, device: str, saves: int, **options) -> tuple[Any, list[str]]:
    """`saves` saves of one state dict on one overlapped queue, each changed in place once staging returned."""
    queue = _queue(overlap_staging=True, **options)
    return queue, saves_then_changes(queue, tmp_path, device, saves, wait_for_staging=True)


def _pool(queue: Any) -> dict[int, list]:
    """The pool's free slabs by byte size."""
    caller = queue._persistent_caller
    assert caller is not None  # a save ran
    by_size: dict[int, list] = {}
    for slab in caller._pool._free:
        by_size.setdefault(slab.nbytes, []).append(slab)
    return by_size


def test_overlapped_saves_hold_the_state_at_the_call_and_reuse_one_slab(tmp_path):
    queue, problems = _saves_then_changes(tmp_path, "cpu", 3)
    try:
        assert not problems, problems
        pool = _pool(queue)
        assert [len(slabs) for slabs in pool.values()] == [1], f"slabs kept after 3 saves of one size: {pool}"
    finally:
        bounded(BOUND, "close()", queue.close)
    assert not _pool(queue), "close() left slabs in the pool"


def test_a_state_dict_that_changes_size_leaves_no_slab_per_size_and_close_frees_them(tmp_path):
    """The pool is bounded (SlabPool.MAX_FREE): growing saves replace the slab, and a smaller save reuses a larger
    slab (up to twice its bytes) instead of making one more."""
    queue = _queue(overlap_staging=True)
    max_free = type(queue._get_async_caller()._pool).MAX_FREE
    seen = []
    try:
        for i, elements in enumerate([BIG, 2 * BIG, 3 * BIG, 4 * BIG, 3 * BIG, 4 * BIG]):
            state = {"t": torch.arange(elements, dtype=torch.float32), "step": i}
            queue.schedule_async_request(plan_write("impl", state, str(tmp_path / f"c{i}")).request())
            queue.wait_for_staging()
            bounded(BOUND, "maybe_finalize_async_calls(blocking=True)", queue.maybe_finalize_async_calls, True)
            seen.append(sorted(_pool(queue)))
        assert all(len(sizes) <= max_free for sizes in seen), f"free slab sizes after each save: {seen}"
        assert len(seen[3]) == 1, f"4 growing saves left slabs of several sizes: {seen[3]}"
        assert seen[4] == seen[3], f"a smaller save made a slab instead of reusing the larger one: {seen}"
    finally:
        bounded(BOUND, "close()", queue.close)
    assert not _pool(queue), "close() left slabs in the pool"


@pytest.mark.gpu  # skips without CUDA (the spec plugin); run by the GPU stages impl-gpu and impl-overlapped-lease
@pytest.mark.parametrize("device_clone", [False, True], ids=["d2h", "clone"])
def test_overlapped_cuda_saves_hold_the_state_at_the_call_and_free_the_pool(tmp_path, device_clone):
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    queue, problems = _saves_then_changes(tmp_path, "cuda", 3, device_clone=device_clone)
    try:
        assert not problems, problems
        (slabs,) = _pool(queue).values()
        assert len(slabs) == 1, f"{len(slabs)} slabs kept after 3 saves of one size"
        assert slabs[0].pinned, "the CUDA tensors' slab is not page-locked"
    finally:
        bounded(BOUND, "close()", queue.close)
    assert not _pool(queue), "close() left slabs in the pool"
    torch.cuda.synchronize()
    # the trainer's own state (3 tensors) is all that stays: no clone outlives its copy
    assert torch.cuda.memory_allocated() - before <= (BIG + 7) * 4 + 4096


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"persistent": False, "overlap_staging": True}, "persistent queue"),
        ({"device_clone": True}, "needs overlap_staging"),
        ({"overlap_staging": 1}, "must be a bool"),
    ],
)
def test_overlapped_staging_options_are_checked(options, match):
    with pytest.raises((ValueError, TypeError), match=match):
        _queue(**options)


class _HeldDeviceCopy:
    """Stands in for the CUDA event of a device-to-host copy that has not ended: `synchronize` blocks until
    `release`, as the host would block on a copy still running."""

    def __init__(self) -> None:
        import threading

        self.released = threading.Event()

    def synchronize(self) -> None:
        assert self.released.wait(BOUND), "the held copy was never released"

    def release(self) -> None:
        self.released.set()


def test_a_request_of_device_tensors_only_never_blocks_the_host_on_its_copies():
    """The staging signal of a request with no CPU tensor waits on the device only (the trainer's stream waits for
    the copies' events): the host thread must not wait for the device-to-host copy to end. Simulated on the CPU:
    the request's copy is held, and wait_for_staging must still return."""
    import sys

    caller = _queue(overlap_staging=True)._get_async_caller()  # impl's OverlappedAsyncCaller, through its adapter
    _Staging = sys.modules[type(caller).__module__]._Staging
    held = _HeldDeviceCopy()
    staging = _Staging(0, (0, False, b"", None), None, [], host_events=[held])
    caller._unsignalled[0] = staging
    caller._start_thread()
    caller._inbox.put(staging)  # the staging thread blocks in held.synchronize(), as on a copy still running
    try:
        bounded(30.0, "wait_for_staging of a request whose copies are all on the device", caller.wait_for_staging)
        assert not held.released.is_set()
    finally:
        held.release()
        caller._stop_thread(abort=False)
