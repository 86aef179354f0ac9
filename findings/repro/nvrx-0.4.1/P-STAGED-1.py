"""P-STAGED-1: once the save is staged, the state dict may change freely; the checkpoint holds it as at start.

Judged with CPU tensors. Documented: torch's AsyncSaveResponse says "staging_completion is a future that indicates
when local copy of state_dict is complete", and NVRx's guide that async checkpointing "ensures model and
optimizer weights are not changing while the model is still checkpointing". NVRx has no separate staging signal,
so the save is staged when schedule_async_request returns.

The recipe is the guide's: FileSystemWriterAsync + save_state_dict_async_plan, get_save_function_and_args, an
AsyncRequest with the writer's preload_fn and save_state_dict_async_finalize, scheduled on the default
(persistent) AsyncCallsQueue. In NVRx 0.4.1, prepare_write_data keeps a contiguous CPU tensor itself in the write
buckets (it clones views only), the request goes to the worker through a torch.multiprocessing queue (which puts
the storage in shared memory), and the worker's preload_tensors `tensor.to("cpu")` is no copy either: the worker
writes the trainer's live memory, so a change made right after scheduling returned reaches the checkpoint.

    python P-STAGED-1.py nvidia_resiliency_ext | impl
"""

import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common  # noqa: E402
import torch  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402

# At import, so that the persistent worker (which re-imports this script) gets the CPU stand-in too.
CORE, WRITERS, SAVER = (_common.module(f"async_ckpt.{m}") for m in ("core", "filesystem_async", "state_dict_saver"))


def _save_then_train(rank: int, world: int, path: str) -> list:
    state = {f"r{rank}": {"w": torch.ones(5), "n": 3}}  # CPU tensors
    writer = WRITERS.FileSystemWriterAsync(path)
    planned = SAVER.save_state_dict_async_plan(state, writer)
    save_fn, preload_fn, save_args = writer.get_save_function_and_args()
    finalize = functools.partial(SAVER.save_state_dict_async_finalize, *planned)
    queue = CORE.AsyncCallsQueue()
    queue.schedule_async_request(CORE.AsyncRequest(save_fn, save_args, [finalize], preload_fn=preload_fn))
    at_start = state[f"r{rank}"]["w"].tolist()
    state[f"r{rank}"]["w"].add_(1)  # staged: the next training step changes the model in place
    queue.maybe_finalize_async_calls(blocking=True)
    queue.close()
    return at_start


def main() -> None:
    with _common.scratch() as tmp:
        results = _common.run_ranks(_save_then_train, f"{tmp}/ckpt", timeout_s=90)
        if any(how != "returned" for how, _ in results.values()):
            _common.setup_failed(results)
        loaded = {f"r{r}": {"w": torch.zeros(5), "n": None} for r in results}
        dcp.load(loaded, checkpoint_id=f"{tmp}/ckpt", no_dist=True)
    wrong = {}
    for rank, (_, at_start) in results.items():
        got = loaded[f"r{rank}"]["w"].tolist()
        print(f"rank {rank}: w when the save started {at_start}, loaded back from disk {got}")
        if got != at_start:
            wrong[rank] = got
    _common.verdict(
        bool(wrong),
        "CPU tensors; "
        + (
            f"the checkpoint holds the values changed after staging on ranks {sorted(wrong)}"
            if wrong
            else "the checkpoint holds the values at start"
        ),
    )


if __name__ == "__main__":
    main()
