"""Device-to-host staging throughput over a size sweep (--bench-sweep-mib). GPU only.

Ran on an H100 at 1 GiB (2026-11-27, docs/benchmarks.md "GPU runs"): every benchmark but `stage:dcp-pinned`, whose
reused DefaultStager raised inside torch 2.11 (fixed since: a fresh stager per round where the release needs one).
Without a GPU every benchmark here skips.

- `copy-pinned` / `copy-pageable` (ceilings `d2h-pinned`, `d2h-pageable`): one copy of a CUDA
  buffer into a preallocated pinned or pageable host buffer.
- `preload:<target>`: the IPC + preload_fn path of the target's persistent AsyncCallsQueue: the
  request carries CUDA tensors (sent as IPC handles); its preload_fn copies them to host in the
  worker; scheduling returns once the worker reports the preload done.
- `stage:impl`: impl's own staging of CUDA tensors given as async_fn arguments (into a pinned
  shared-memory slab, before scheduling returns).
- `stage:dcp-pinned`: `DefaultStager` of torch DCP with a pinned, reused buffer.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

from ckptspec.bench.dcp_stager import KeptStager
from ckptspec.bench.harness import record
from ckptspec.bench.peers import unavailable
from ckptspec.bench.workload import make_state_dict, tensors
from ckptspec.spec.harness import load_target

pytestmark = pytest.mark.gpu

MiB = 1 << 20


def to_host(device_tensors: dict) -> dict:
    """preload_fn body: copy to host (pinned, non-blocking) and wait, as NVRx's preload_tensors does."""
    host = {k: t.to("cpu", non_blocking=True) for k, t in device_tensors.items()}
    torch.cuda.synchronize()
    return host


def discard(*args) -> None:
    """async_fn that only receives what was staged."""


@pytest.mark.parametrize("kind", ["pinned", "pageable"])
def test_d2h_copy(benchmark, bench, d2h_mib, kind):
    """Ceiling: one D2H copy into a preallocated host buffer."""
    nbytes = d2h_mib * MiB
    src = torch.randint(0, 256, (nbytes,), dtype=torch.uint8, device="cuda")
    dst = torch.empty(nbytes, dtype=torch.uint8, pin_memory=kind == "pinned")

    def copy():
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()

    bench.run(benchmark, copy, warmup=1)
    record(benchmark, bench, "ceiling", f"d2h-{kind}", bytes=nbytes)


def _bench_queue(benchmark, bench, core, request, peer: str, nbytes: int) -> None:
    queue = core.AsyncCallsQueue(persistent=True)

    def finalize_previous():
        queue.maybe_finalize_async_calls(blocking=True, no_dist=True)

    try:
        bench.run(benchmark, lambda: queue.schedule_async_request(request), setup=finalize_previous, warmup=1)
        finalize_previous()
    finally:
        queue.close()
    record(benchmark, bench, "d2h", peer, bytes=nbytes)


@pytest.mark.parametrize("target_name", ["impl", "nvrx", "mcore"])
def test_d2h_preload(benchmark, bench, process_group, d2h_mib, target_name):
    """IPC + preload_fn staging through the target's persistent worker."""
    if reason := unavailable(f"torch:{target_name}"):  # NVRx and Megatron-Core are peers where installed
        pytest.skip(reason)
    core = load_target(target_name).module("async_ckpt.core")
    state = tensors(make_state_dict(d2h_mib * MiB, "cuda"))
    request = core.AsyncRequest(discard, (None, None), [], preload_fn=partial(to_host, state))
    _bench_queue(benchmark, bench, core, request, f"preload:{target_name}", sum(t.nbytes for t in state.values()))


def test_d2h_stage_impl(benchmark, bench, process_group, d2h_mib):
    """impl's staging of CUDA arguments into its pinned slab."""
    core = load_target("impl").module("async_ckpt.core")
    state = tensors(make_state_dict(d2h_mib * MiB, "cuda"))
    request = core.AsyncRequest(discard, (None, state), [])
    _bench_queue(benchmark, bench, core, request, "stage:impl", sum(t.nbytes for t in state.values()))


def test_d2h_stage_dcp_pinned(benchmark, bench, d2h_mib):
    """torch DCP's DefaultStager into pinned memory, kept across rounds where the release allows it (a fresh one per
    round, made outside the timed call and named in `note`, where it does not: torch 2.11, ckptspec/bench/dcp_stager.py)."""
    state = tensors(make_state_dict(d2h_mib * MiB, "cuda"))
    kept = KeptStager(
        StagingOptions(
            use_pinned_memory=True, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=True
        )
    )
    box: dict[str, DefaultStager] = {}
    try:
        bench.run(benchmark, lambda: box["stager"].stage(state), setup=lambda: box.update(stager=kept.for_save()))
    finally:
        kept.close()
    info = {"note": kept.note} if kept.note else {}
    record(benchmark, bench, "d2h", "stage:dcp-pinned", bytes=sum(t.nbytes for t in state.values()), **info)
