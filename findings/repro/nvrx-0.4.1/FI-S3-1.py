"""FI-S3-1: an S3 endpoint answering 5xx during a save through Multi-Storage Client fails the save with
CheckpointException on every rank within 30 s, and no .metadata object is written.

Shown on NVRx 0.4.1 (a failed data upload on rank 1 and a failed .metadata upload) and 0.7.0 (the .metadata upload
only). 000: "nvidia_resiliency_ext supports saving checkpoints to object stores like AWS S3";
AsyncCallsQueue.maybe_finalize_async_calls: "CheckpointException - if any rank(s) raised an exception during
checkpoint writing, the exceptions are wrapped and raised on all ranks".

0.4.1: rank 1's failed upload surfaces as RuntimeError("Worker failure: ...") from retrieve_write_results() in that
rank's finalize only, before it joins the gather of write results, where rank 0 is left waiting (0.7.0 wraps the
error for the gather and raises CheckpointException on both ranks). In both, the coordinator's failed .metadata
upload escapes finish() as MSC's RetryableError on rank 0, which never reaches the collective that ends the
finalize, where rank 1 waits. The endpoint is a stand-in S3 server on loopback (_common.s3_stub): 500 to rank 1's
data object, 503 to .metadata; two ranks, the persistent caller, no retries.

    python FI-S3-1.py nvidia_resiliency_ext | impl
"""

import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common
from torch.distributed.checkpoint import DefaultSavePlanner

# At import, so that spawned checkpoint workers get the CPU stand-in too.
core = _common.module("async_ckpt.core")
writers = _common.module("async_ckpt.filesystem_async")
saver = _common.module("async_ckpt.state_dict_saver")
BOUND_S = 30  # the clause's bound on the blocking finalize (gloo's own timeout is 30 min)
CASES = {"data": ("/data/__1_0.distcp", 500), "metadata": ("/metadata/.metadata", 503)}


def _body(rank: int, world: int, config: str, tmp: str, case: str) -> str:
    import torch

    os.environ["MSC_CONFIG"] = config  # before the checkpoint worker starts: it inherits the environment
    queue = _common.started_queue()
    writer = writers.FileSystemWriterAsync(f"msc://stub/{case}", thread_count=1, use_msc=True)
    state = {f"r{rank}": torch.arange(12.0) + rank}
    planned = saver.save_state_dict_async_plan(state, writer, None, 0, planner=DefaultSavePlanner())
    save_fn, preload_fn, args = writer.get_save_function_and_args()
    finalize = functools.partial(saver.save_state_dict_async_finalize, *planned)
    queue.schedule_async_request(core.AsyncRequest(save_fn, tuple(args), [finalize], preload_fn=preload_fn))
    seen = _common.outcome(BOUND_S, queue.maybe_finalize_async_calls, True)
    _common.linger(tmp, rank, world, BOUND_S)
    return seen


def main() -> None:
    broken = False
    for case, (path, status) in CASES.items():
        with _common.s3_stub({path: status}) as (config, stored), _common.scratch() as tmp:
            results = _common.run_ranks(_body, config, tmp, case, timeout_s=240)  # a safety net: BOUND_S is in _body
        if any(how != "returned" for how, _ in results.values()):
            _common.setup_failed(results)
        seen = {rank: value for rank, (_, value) in results.items()}
        metadata = [p for p in stored if p.endswith(".metadata")]
        print(f"{status} for {path}: blocking finalize per rank {seen}; .metadata stored: {metadata}")
        broken |= any(not value.startswith("CheckpointException") for value in seen.values()) or bool(metadata)
    _common.verdict(broken, f"each save should raise CheckpointException on every rank within {BOUND_S} s")


if __name__ == "__main__":
    main()
