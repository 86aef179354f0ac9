"""MSC-3: object-store errors in a save through Multi-Storage Client raise CheckpointException, and no .metadata
object is written.

Shown on NVRx 0.4.1 (a failed data upload and a failed .metadata upload) and 0.7.0 (the .metadata upload only).
AsyncCallsQueue.maybe_finalize_async_calls documents "CheckpointException - if any rank(s) raised an exception
during checkpoint writing, the exceptions are wrapped and raised on all ranks".

With use_msc=True the writer uploads each data file through msc.open() and, in finish(), .metadata the same way.
0.4.1: a failed data upload comes back through the results queue and retrieve_write_results() raises it as
RuntimeError("Worker failure: ..."); 0.7.0 wraps it for the gather and raises CheckpointException. In both, a
failed .metadata upload escapes finish() as MSC's own RetryableError. The endpoint is a stand-in S3 server on
loopback (_common.s3_stub) answering 500 to one data object and 503 to one .metadata; one rank, the temporal
caller, no retries.

    python MSC-3.py nvidia_resiliency_ext | impl
"""

import functools
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common
import torch
from torch.distributed.checkpoint import DefaultSavePlanner

BOUND_S = 30
CASES = {"data": ("/data/__0_0.distcp", 500), "metadata": ("/metadata/.metadata", 503)}


def _save(core, writers, saver, url: str) -> None:
    writer = writers.FileSystemWriterAsync(url, thread_count=1, use_msc=True)
    state = {"a": torch.arange(256.0), "step": 1}
    planned = saver.save_state_dict_async_plan(state, writer, None, 0, planner=DefaultSavePlanner())
    save_fn, preload_fn, args = writer.get_save_function_and_args()
    finalize = functools.partial(saver.save_state_dict_async_finalize, *planned)
    queue = core.AsyncCallsQueue(persistent=False)
    queue.schedule_async_request(core.AsyncRequest(save_fn, tuple(args), [finalize], preload_fn=preload_fn))
    queue.maybe_finalize_async_calls(blocking=True)


def _body(rank: int, world: int, config: str) -> dict:
    os.environ["MSC_CONFIG"] = config
    modules = [_common.module(f"async_ckpt.{m}") for m in ("core", "filesystem_async", "state_dict_saver")]
    return {case: _common.outcome(BOUND_S, _save, *modules, f"msc://stub/{case}") for case in CASES}


def main() -> None:
    with _common.s3_stub(dict(CASES.values())) as (config, stored):
        results = _common.run_ranks(_body, config, world=1, timeout_s=120)
    how, seen = results[0]
    if how != "returned":
        _common.setup_failed(results)
    broken = False
    for case, (path, status) in CASES.items():
        metadata = [p for p in stored if p.startswith(f"/ckpt/{case}/") and p.endswith(".metadata")]
        print(f"{status} for {path}: blocking finalize {seen[case]!r}; .metadata stored: {metadata}")
        broken |= not seen[case].startswith("CheckpointException") or bool(metadata)
    _common.verdict(broken, "each failed save should raise CheckpointException and store no .metadata")


if __name__ == "__main__":
    main()
