"""AR-8: a no-op request (async_fn=None) on a persistent queue is never finalized: the blocking finalize hangs.

AsyncRequest documents "async_fn (Callable, optional) - async function to call. None represents noop." In NVRx
0.4.1 and 0.7.0 and Megatron-Core 0.16.1 and 0.19.2, PersistentAsyncCaller.schedule_async_call returns at once
for async_fn=None, so the no-op is never put on the worker's queue; yet the queue gives it an index and, once the
worker is running, is_current_async_call_done(blocking=True) waits in a loop for the worker's completion message
for it, which never comes. A real request followed by a no-op one: the blocking finalize never returns.

    python AR-8.py nvidia_resiliency_ext | megatron.core | impl
"""

import functools
import multiprocessing
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common

# At import: the persistent worker (a spawned process) re-imports this script and needs the CPU stand-in too.
core = _common.module("async_ckpt.core")
WORKER_START_S = 120  # for the worker to start and run the real request (it imports the package first)
NOOP_BOUND_S = 20  # then for the blocking finalize to finalize the no-op request


def _append(log: str, text: str) -> None:
    with open(log, "a") as f:
        f.write(text + "\n")


def _body(rank: int, world: int, tmp: str) -> dict:
    log = os.path.join(tmp, "log")
    queue = core.AsyncCallsQueue(persistent=True)
    real = core.AsyncRequest(_append, (log, "real"), [functools.partial(_append, log, "fin0")])
    noop = core.AsyncRequest(None, (), [functools.partial(_append, log, "fin1")])
    indices = (queue.schedule_async_request(real), queue.schedule_async_request(noop))
    raised = []

    def blocking_finalize() -> None:
        try:
            queue.maybe_finalize_async_calls(blocking=True)
        except BaseException as exc:  # catches all: reported with the result
            raised.append(f"{type(exc).__name__}: {exc}")

    finalize = threading.Thread(target=blocking_finalize, daemon=True)
    finalize.start()
    # The bound starts once the real request is finalized: starting the worker (a fresh interpreter importing the
    # package) may take long on a loaded machine, and is not what is shown.
    deadline = time.monotonic() + WORKER_START_S
    while "fin0" not in _effects(log) and finalize.is_alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    if "fin0" not in _effects(log):
        raise RuntimeError(f"the real request was not finalized within {WORKER_START_S} s: {_effects(log)}")
    finalize.join(NOOP_BOUND_S)
    if finalize.is_alive():
        for child in multiprocessing.active_children():  # the worker: a blocked close() would only wait for it
            child.kill()
        return {"hung": True, "effects": _effects(log)}
    pending = queue.get_num_unfinalized_calls()
    queue.close()
    return {"indices": indices, "pending": pending, "effects": _effects(log), "raised": raised}


def _effects(log: str) -> list:
    return Path(log).read_text().split() if os.path.exists(log) else []


def main() -> None:
    with _common.scratch() as tmp:
        how, value = _common.run_ranks(_body, tmp, world=1, timeout_s=WORKER_START_S + NOOP_BOUND_S + 30)[0]
    if how != "returned":
        _common.setup_failed({0: (how, value)})
    if value.get("hung"):
        _common.verdict(
            True,
            f"the real request was finalized, then maybe_finalize_async_calls(blocking=True) was still waiting "
            f"for the no-op request {NOOP_BOUND_S} s later (effects: {value['effects']}; expected "
            "['real', 'fin0', 'fin1'])",
        )
    expected = {"indices": (0, 1), "pending": 0, "effects": ["real", "fin0", "fin1"], "raised": []}
    _common.verdict(
        value != expected, f"a real request then a no-op one, blocking finalize: {value} (expected {expected})"
    )


if __name__ == "__main__":
    main()
