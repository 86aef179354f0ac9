"""Assertions with messages that name the value, the expectation and the call."""

from __future__ import annotations

import threading

import torch

__all__ = ["assert_state_dict_equal", "bounded"]


def bounded(seconds: float, what: str, fn, *args, **kwargs):
    """Run fn in a helper thread; fail if it has not returned within `seconds` (the spec's bound).

    On timeout the thread is left behind, so the calling rank must be discarded (the runner does).
    """
    __tracebackhide__ = True
    box: dict = {}

    def run():
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # CheckpointException is a BaseException
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"bounded:{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise AssertionError(f"{what} did not return within {seconds:g}s, but the spec bounds it")
    if "error" in box:
        raise box["error"]
    return box.get("value")


def assert_state_dict_equal(actual, expected, *, call: str = "", path: str = "state_dict") -> None:
    """Equal structure, types, and tensors equal in dtype, shape and every element."""
    __tracebackhide__ = True
    where = f" [{call}]" if call else ""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path} is {type(actual).__name__}, but should be a Tensor{where}"
        assert actual.dtype == expected.dtype, f"{path}.dtype={actual.dtype}, but should be {expected.dtype}{where}"
        assert actual.shape == expected.shape, f"{path}.shape={tuple(actual.shape)}, but should be {tuple(expected.shape)}{where}"
        assert torch.equal(actual.cpu(), expected.cpu()), f"{path}={actual!r}, but should be {expected!r}{where}"
        return
    assert type(actual) is type(expected), f"{path} is {type(actual).__name__}, but should be {type(expected).__name__}{where}"
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys(), f"{path} keys={sorted(map(str, actual))}, but should be {sorted(map(str, expected))}{where}"
        for key in expected:
            assert_state_dict_equal(actual[key], expected[key], call=call, path=f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"len({path})={len(actual)}, but should be {len(expected)}{where}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_state_dict_equal(a, e, call=call, path=f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}={actual!r}, but should be {expected!r}{where}"
