"""Names and parameters documented for the async core, at their documented module paths (API-1)."""

import inspect
from typing import Any

import pytest

from spec_tests.harness.targets import MissingCapability

# module -> class -> method -> documented parameters (name, default); inspect.Parameter.empty = required
EMPTY = inspect.Parameter.empty
MANIFEST: dict[str, dict[str, dict[str, list[tuple[str, Any]]]]] = {
    "async_ckpt.core": {
        "AsyncCaller": {
            "schedule_async_call": [("async_req", EMPTY)],
            "is_current_async_call_done": [("blocking", None), ("no_dist", None)],
            "sync_all_async_calls": [("is_alive", EMPTY)],
            "close": [("abort", False)],
        },
        "TemporalAsyncCaller": {
            "schedule_async_call": [("async_req", EMPTY)],
            "is_current_async_call_done": [("blocking", False), ("no_dist", False)],
            "close": [("abort", False)],
        },
        "PersistentAsyncCaller": {
            "schedule_async_call": [("async_req", EMPTY)],
            "is_current_async_call_done": [("blocking", False), ("no_dist", False)],
            "close": [("abort", False)],
        },
        "AsyncCallsQueue": {
            "__init__": [("persistent", None)],
            "schedule_async_request": [("async_request", EMPTY)],
            "maybe_finalize_async_calls": [("blocking", False), ("no_dist", False)],
            "get_num_unfinalized_calls": [],
            "close": [("abort", False)],
        },
        "AsyncRequest": {"add_finalize_fn": [("fn", EMPTY)], "execute_sync": [], "freeze": []},
    },
    "async_ckpt.torch_ckpt": {
        "TorchAsyncCheckpoint": {
            "__init__": [("persistent_queue", True)],
            "async_save": [("state_dict", EMPTY)],
            "finalize_async_save": [("blocking", False), ("no_dist", True), ("terminate", False)],
        },
    },
}
CASES = [
    pytest.param(mod, cls, meth, params, id=f"{mod}.{cls}.{meth}")
    for mod, classes in MANIFEST.items()
    for cls, methods in classes.items()
    for meth, params in methods.items()
]


@pytest.mark.spec("API-1")
@pytest.mark.parametrize("module, cls, method, params", CASES)
def test_documented_method_exists_with_its_parameters(target, module, cls, method, params):
    try:
        mod = target.module(module)
    except MissingCapability as exc:
        pytest.skip(str(exc))
    assert hasattr(mod, cls), f"{mod.__name__} has no {cls}"
    fn = getattr(getattr(mod, cls), method, None)
    assert callable(fn), f"{cls}.{method} is missing"
    sig = inspect.signature(fn)
    for name, default in params:
        assert name in sig.parameters, f"{cls}.{method}{sig} has no parameter {name!r}"
        actual = sig.parameters[name].default
        if default is not None:
            assert actual == default, f"{cls}.{method}: {name}={actual!r}, but should default to {default!r}"
