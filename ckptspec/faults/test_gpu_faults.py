"""GPU runs: CUDA IPC staging in the persistent worker, and the cross-rank faults over NCCL.

Both skip without the hardware (the `gpu` marker, and the runner's NCCL check for two GPUs). The CUDA IPC test ran on
an H100 (2026-11-27, docs/gpu.md): its checks passed, and its orphan audit charged one /dev/shm entry of the CUDA
driver. The NCCL test needs two GPUs and has not run yet.
"""

import functools
import gc
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from ckptspec.faults.faults import ERRNOS
from ckptspec.faults.storage_errors import WORLD, ErrnoSaves, storage_errors
from ckptspec.spec.drivers.bounds import BOUND
from ckptspec.spec.drivers.faults.tmpdirs import on_ranks
from ckptspec.spec.harness import async_core, bounded


def stage_to_host(marker: str, state: dict) -> dict:
    """preload_fn: record where it ran and what it received, return host copies."""
    with open(marker, "w") as f:
        f.write(f"{os.getpid()} {' '.join(sorted({t.device.type for t in state.values()}))}")
    return {k: v.to("cpu") for k, v in state.items()}


def save_staged(path: str, staged: dict) -> None:
    torch.save(staged, path)


@dataclass(frozen=True)
class CudaIpc:
    in_worker: bool  # preload_fn ran in another process than the trainer
    devices: str  # device types of the tensors preload_fn received
    saved_equal: bool  # the checkpoint holds the tensor as it was when scheduling returned
    leaked: int  # bytes of GPU memory still allocated after close()


def _cuda_ipc(tmp):
    core = async_core()
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    state = {"w": torch.arange(1 << 16, dtype=torch.float32, device="cuda")}
    expected = state["w"].cpu()
    marker, out = os.path.join(tmp, "preloaded"), os.path.join(tmp, "saved.pt")
    queue = core.AsyncCallsQueue(persistent=True)
    queue.schedule_async_request(
        core.AsyncRequest(save_staged, (out, None), [], preload_fn=functools.partial(stage_to_host, marker, state))
    )
    state["w"].add_(1)  # the next training step, right after scheduling returned
    bounded(BOUND, "maybe_finalize_async_calls(blocking=True)", queue.maybe_finalize_async_calls, True)
    bounded(BOUND, "close()", queue.close)
    pid, devices = Path(marker).read_text().split(" ", 1)
    saved_equal = torch.equal(torch.load(out)["w"], expected)
    del state, queue
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.ipc_collect()
    return CudaIpc(int(pid) != os.getpid(), devices, saved_equal, torch.cuda.memory_allocated() - baseline)


@pytest.mark.gpu
@pytest.mark.spec("FI-GPU-1")
@pytest.mark.needs("persistent_caller")
@pytest.mark.parametrize("phase", ["staging"])
def test_cuda_tensors_reach_the_worker_by_ipc_and_are_staged_there(tmp_path, phase):
    (ipc,) = on_ranks(1, _cuda_ipc, str(tmp_path), timeout=120)
    assert ipc.in_worker, "preload_fn ran in the trainer, not in the persistent worker"
    assert ipc.devices == "cuda", f"preload_fn received tensors on {ipc.devices}, not CUDA tensors (IPC)"
    assert ipc.saved_equal, "an in-place update after scheduling returned reached the checkpoint"
    assert ipc.leaked == 0, f"{ipc.leaked} bytes of GPU memory remain allocated after close()"


@dataclass(frozen=True)
class DevicesAndErrors:
    devices: list  # the CUDA device of every rank, as this rank gathered them
    errors: dict[str, ErrnoSaves]  # per errno, as in test_storage_faults


def _devices_then_storage_errors(tmp, phase):
    import torch.distributed as dist

    device = torch.cuda.current_device()
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, device)
    return DevicesAndErrors(seen, storage_errors(tmp, phase))


@pytest.mark.gpu
@pytest.mark.spec("FI-GPU-2")
@pytest.mark.needs("storage_writer", "persistent_caller")
@pytest.mark.parametrize("phase", ["write"])
def test_storage_errors_over_nccl_with_a_gpu_per_rank(tmp_path, phase):
    results = on_ranks(WORLD, _devices_then_storage_errors, str(tmp_path), phase, timeout=150, backend="nccl")
    devices = results[0].devices
    assert len(set(devices)) == WORLD, f"ranks share a GPU: devices per rank {devices}"
    for errno_name in ERRNOS:
        outcomes = [r.errors[errno_name].outcome for r in results]
        assert outcomes == ["CheckpointException"] * WORLD, f"{errno_name} over NCCL: outcome per rank {outcomes}"
