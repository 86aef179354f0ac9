"""SD-8: after init_checkpoint_metadata_cache(loaded metadata), a cached save of the same structure reuses that
metadata, and a save of a different structure plans afresh and is complete.

Documented: init_checkpoint_metadata_cache "creates a new CheckpointMetadataCache instance and sets the cached
global metadata from the previous checkpoint"; its flag validated_loaded_metadata_reuse means "the metadata loaded
from the prev checkpoint is validated to reuse" (reuse is only for a structure the loaded plans match).

In NVRx 0.4.1 and 0.7.0 alike, save_state_dict_async_plan starts from the cache's cached_local_plan, and its local_step makes a
new local plan only when that is None. After one cached save the cache holds that save's local plan, so the next
cached save never plans the current state dict: the stale plan matches the loaded plans, verify_global_md_reuse
passes, and the loaded metadata is reused. A key added on rank 1 is neither written nor in .metadata. (The
findings page names verify_global_md_reuse's device='cuda' flag tensor; with the CPU stand-in for that one call,
the logic error above is what remains; 0.7.0 has no get_metadata_caching_status, so its status is not shown.)
Decentralized planner, 2 gloo ranks, execute_sync.

    python SD-8.py nvidia_resiliency_ext | impl
"""

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import DefaultSavePlanner, FileSystemReader


class DecentralizedPlanner(DefaultSavePlanner):
    """The stock planner, marked able to make its global plan without the other ranks (as Megatron's is)."""

    can_run_decentralized_global_plan = True

    def create_decentralized_global_plan(self, local_plan):
        return local_plan


def _save(state: dict, path: str, enable_cache: bool) -> None:
    core, writers, saver = (_common.module(f"async_ckpt.{m}") for m in ("core", "filesystem_async", "state_dict_saver"))
    writer = writers.FileSystemWriterAsync(path)
    planned = saver.save_state_dict_async_plan(state, writer, planner=DecentralizedPlanner(), enable_cache=enable_cache)
    save_fn, preload_fn, save_args = writer.get_save_function_and_args()
    finalize = functools.partial(saver.save_state_dict_async_finalize, *planned)
    core.AsyncRequest(save_fn, save_args, [finalize], preload_fn=preload_fn).execute_sync()
    dist.barrier()  # the coordinator has written .metadata


def _body(rank: int, world: int, tmp: str) -> list:
    saver = _common.module("async_ckpt.state_dict_saver")
    state = {f"rank{rank}": {"w": torch.full((4,), float(rank)), "i": torch.arange(rank + 2)}}
    _save(state, f"{tmp}/first", enable_cache=False)
    saver.init_checkpoint_metadata_cache(FileSystemReader(f"{tmp}/first").read_metadata())  # as on resume
    status = getattr(saver, "get_metadata_caching_status", lambda: "n/a (not in this release)")
    state[f"rank{rank}"]["w"].add_(1)
    _save(state, f"{tmp}/same", enable_cache=True)  # same structure: the loaded metadata may be reused
    statuses = [status()]
    if rank == 1:
        state["rank1"]["extra"] = torch.ones(2)  # the structure changes on rank 1
    _save(state, f"{tmp}/changed", enable_cache=True)
    return [*statuses, status()]


def main() -> None:
    with _common.scratch() as tmp:
        results = _common.run_ranks(_body, tmp, timeout_s=90)
        if any(how != "returned" for how, _ in results.values()):
            _common.setup_failed(results)
        recorded = sorted(FileSystemReader(f"{tmp}/changed").read_metadata().state_dict_metadata)
        target = {"rank1": {"extra": torch.zeros(2)}}
        try:
            dcp.load(target, checkpoint_id=f"{tmp}/changed", no_dist=True)
            loaded = f"rank1.extra loaded back as {target['rank1']['extra'].tolist()}"
        except BaseException as exc:  # catches all: dcp raises CheckpointException, a BaseException
            loaded = f"loading rank1.extra raised {type(exc).__name__}"
    for rank, (_, statuses) in sorted(results.items()):
        print(f"rank {rank}: get_metadata_caching_status() after the same / changed save: {statuses}")
    print(f"the changed save's .metadata records {recorded}; {loaded}")
    _common.verdict(
        "rank1.extra" not in recorded,
        "after rank 1 added 'extra', the cached save "
        + ("reused the loaded metadata and lost the new key" if "rank1.extra" not in recorded else "planned afresh"),
    )


if __name__ == "__main__":
    main()
