"""FS-10: if writing fails on any rank, finalization raises CheckpointException on every rank, within a bound,
and no .metadata is written.

Documented: AsyncCallsQueue.maybe_finalize_async_calls, Raises: "CheckpointException - if any rank(s) raised an
exception during checkpoint writing, the exceptions are wrapped and raised on all ranks"; save_state_dict_async_
finalize writes the metadata only "if len(node_failures) == 0" and otherwise raises CheckpointException("write").

In NVRx 0.4.1 the finalize function save_state_dict_async_finalize first calls the writer's
retrieve_write_results, which on the rank whose write failed raises RuntimeError("Worker failure: ...") at once,
before that rank joins gather_object. The other ranks are already in gather_object waiting for it and never
return. Here rank 1's data file cannot be created (a directory holds its name); the save uses the guide's recipe
on a temporal AsyncCallsQueue, and each rank's blocking finalize is given 20 s.

    python FS-10.py nvidia_resiliency_ext | impl
"""

import functools
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common
import torch

BOUND = 20.0


def _save(rank: int, world: int, path: str, done: str) -> str:
    core, writers, saver = (_common.module(f"async_ckpt.{m}") for m in ("core", "filesystem_async", "state_dict_saver"))
    state = {f"rank{rank}": {"w": torch.full((3,), float(rank))}, "step": 7}
    writer = writers.FileSystemWriterAsync(path)
    planned = saver.save_state_dict_async_plan(state, writer)
    save_fn, preload_fn, save_args = writer.get_save_function_and_args()
    finalize = functools.partial(saver.save_state_dict_async_finalize, *planned)
    queue = core.AsyncCallsQueue(persistent=False)
    queue.schedule_async_request(core.AsyncRequest(save_fn, save_args, [finalize], preload_fn=preload_fn))
    outcome = {}

    def blocking_finalize() -> None:
        try:
            queue.maybe_finalize_async_calls(blocking=True)
            outcome["how"] = "returned normally"
        except BaseException as exc:  # catches all: CheckpointException is a BaseException; its type is judged
            outcome["how"] = f"{type(exc).__name__}: {str(exc)[:120]}"

    waiter = threading.Thread(target=blocking_finalize, daemon=True)
    waiter.start()
    waiter.join(BOUND)
    Path(done, str(rank)).touch()  # stay connected until every rank is done, so no rank sees a peer vanish
    deadline = time.monotonic() + BOUND
    while len(os.listdir(done)) < world and time.monotonic() < deadline:
        time.sleep(0.05)
    return outcome.get("how", f"still waiting after {BOUND:g} s")


def main() -> None:
    with _common.scratch() as tmp:
        path, done = os.path.join(tmp, "ckpt"), os.path.join(tmp, "done")
        os.makedirs(os.path.join(path, "__1_0.distcp"))  # where rank 1 writes its data file: its write fails
        os.makedirs(done)
        results = _common.run_ranks(_save, path, done, timeout_s=3 * BOUND + 30)
        committed = os.path.exists(os.path.join(path, ".metadata"))
    for rank, (how, value) in sorted(results.items()):
        print(f"rank {rank}: {how}: {value}")
    every_rank = all(how == "returned" and value.startswith("CheckpointException") for how, value in results.values())
    _common.verdict(
        not every_rank or committed,
        f"rank 1's write failed: CheckpointException on every rank within {BOUND:g} s: {every_rank}; "
        f".metadata written: {committed}",
    )


if __name__ == "__main__":
    main()
