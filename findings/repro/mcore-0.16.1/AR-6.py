"""AR-6: execute_sync() is not what the async call does: with a preload_fn it refuses a request that has not exactly
three positional arguments, where both of the queue's callers run it.

AsyncRequest documents preload_fn as "self-contained with a proper list of arguments with partial" (so it is called
with no arguments), and NVRx's execute_sync passes its result as argument 1 of async_fn ("the 2nd arg is state
dict"). In Megatron-Core 0.16.1 and 0.19.2, AsyncRequest.execute_sync with a preload_fn first asserts
`len(async_fn_args) == 3` (the layout of Megatron's own FileSystemWriterAsync), so a request with another number of
arguments fails with AssertionError instead of async_fn getting the preloaded data as argument 1, while the temporal
and persistent callers run the same request with the preloaded value as argument 1 (no such check). The assertion is
raised before anything is written: a wrong error, no data lost.

    python AR-6.py nvidia_resiliency_ext | megatron.core | impl
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common

core = _common.module("async_ckpt.core")


def _body(rank: int, world: int) -> dict:
    effects = []
    request = core.AsyncRequest(
        lambda *args: effects.append(("async_fn", args)),
        ("first", "placeholder"),
        [lambda: effects.append(("finalize",))],
        preload_fn=lambda: effects.append(("preload",)) or "preloaded",
    )
    try:
        request.execute_sync()  # barrier() needs the process group run_ranks sets up
    except Exception as exc:  # catches all: what is judged is what execute_sync did
        effects.append(("raised", f"{type(exc).__name__}: {exc}"))
    return {"effects": effects, "args_unchanged": request.async_fn_args == ("first", "placeholder")}


def main() -> None:
    how, value = _common.run_ranks(_body, world=1, timeout_s=30)[0]
    if how != "returned":
        _common.setup_failed({0: (how, value)})
    expected = {
        "effects": [("preload",), ("async_fn", ("first", "preloaded")), ("finalize",)],
        "args_unchanged": True,
    }
    _common.verdict(
        value != expected,
        f"execute_sync() of a two-argument request with a preload_fn: {value} (expected {expected})",
    )


if __name__ == "__main__":
    main()
