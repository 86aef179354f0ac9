"""FI-STORAGE-1: a storage error in a DCP save fails the save with CheckpointException on every rank within 30 s.

Shown on NVRx 0.4.1 (data file and metadata) and 0.7.0 (metadata only). AsyncCallsQueue.maybe_finalize_async_calls documents "CheckpointException - if any
rank(s) raised an exception during checkpoint writing, the exceptions are wrapped and raised on all ranks", and
save_state_dict_async_finalize raises CheckpointException("write", node_failures) for failed writes.

Data file (0.4.1): save_state_dict_async_finalize first calls storage_writer.retrieve_write_results(), which
raises RuntimeError("Worker failure: ...") on the failing rank only, before that rank joins the gather of write
results, so the other rank is left waiting in the gather (0.7.0 wraps the error for the gather and raises
CheckpointException on both ranks). Metadata (0.4.1 and 0.7.0): storage_writer.finish()
raises the plain OSError on the coordinator, which then never reaches the call_idx all-reduce at the end of
execute_finalize_fns (0.7.0: the failure broadcast), where rank 1 waits. The disk-full error (ENOSPC when a
matching file is created) is injected by replacing `open` in the one process that creates the file: rank 1's
checkpoint worker (its data file) or rank 0's trainer (.metadata).

    python FI-STORAGE-1.py nvidia_resiliency_ext | impl
"""

import _io
import builtins
import errno
import fnmatch
import functools
import io
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common
from torch.distributed.checkpoint import DefaultSavePlanner

FULL_DISK = "CKPTSPEC_REPRO_FULL_DISK"  # "<file name pattern>|<log>": set by rank 1 for its checkpoint worker
BOUND_S = 30  # the clause's bound on the blocking finalize (gloo's own timeout is 30 min)


REAL_OPEN = io.open


def full_disk(pattern: str, log: str):
    """An `open` for which creating a file named like `pattern` fails with ENOSPC (logged to `log`)."""

    def full_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax") and fnmatch.fnmatch(os.path.basename(str(file)), pattern):
            with REAL_OPEN(log, "a") as f:
                f.write(f"{file}\n")
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(file))
        return REAL_OPEN(file, mode, *args, **kwargs)

    return full_open


def use_open(fn) -> None:
    """Make `fn` this process's (and its forks') open. The releases reach it as builtins.open, io.open or _io.open
    (0.7.0's writer holds `open` itself, which pickles by that name to the worker): all three are replaced."""
    builtins.open = io.open = _io.open = fn


def on_full_disk(pattern: str, log: str, fn) -> None:
    """fn() with full_disk(pattern, log) as open while it runs."""
    use_open(full_disk(pattern, log))
    try:
        fn()
    finally:
        use_open(REAL_OPEN)


if FULL_DISK in os.environ:  # a checkpoint worker, spawned by rank 1: it re-imports this script
    use_open(full_disk(*os.environ[FULL_DISK].split("|")))
# At import, so that spawned checkpoint workers get the CPU stand-in too.
core = _common.module("async_ckpt.core")
writers = _common.module("async_ckpt.filesystem_async")
saver = _common.module("async_ckpt.state_dict_saver")


def _body(rank: int, world: int, tmp: str, phase: str) -> str:
    import torch

    if phase == "write" and rank == 1:
        os.environ[FULL_DISK] = f"*.distcp|{tmp}/fired"
    queue = _common.started_queue()
    writer = writers.FileSystemWriterAsync(os.path.join(tmp, "ckpt"), thread_count=1)
    state = {f"r{rank}": torch.arange(12.0) + rank}
    planned = saver.save_state_dict_async_plan(state, writer, None, 0, planner=DefaultSavePlanner())
    save_fn, preload_fn, args = writer.get_save_function_and_args()
    finalize = functools.partial(saver.save_state_dict_async_finalize, *planned)
    if phase == "finalize" and rank == 0:
        finalize = functools.partial(on_full_disk, ".metadata*", f"{tmp}/fired", finalize)
    queue.schedule_async_request(core.AsyncRequest(save_fn, tuple(args), [finalize], preload_fn=preload_fn))
    seen = _common.outcome(BOUND_S, queue.maybe_finalize_async_calls, True)
    _common.linger(tmp, rank, world, BOUND_S)
    return seen


def main() -> None:
    problems = []
    for phase, where in (("write", "rank 1's data file"), ("finalize", "rank 0's .metadata")):
        with _common.scratch() as tmp:
            results = _common.run_ranks(_body, tmp, phase, timeout_s=240)  # a safety net: BOUND_S is in _body
            fired = os.path.exists(f"{tmp}/fired")
        if not fired or any(how != "returned" for how, _ in results.values()):
            print(f"ENOSPC creating {where}: " + ("" if fired else "the fault never fired"))
            _common.setup_failed(results)
        seen = {rank: value for rank, (_, value) in results.items()}
        print(f"ENOSPC creating {where}: blocking finalize per rank {seen}")
        if any(not value.startswith("CheckpointException") for value in seen.values()):
            problems.append(phase)
    _common.verdict(
        bool(problems),
        f"each save should raise CheckpointException on every rank within {BOUND_S} s; not so: {problems}",
    )


if __name__ == "__main__":
    main()
