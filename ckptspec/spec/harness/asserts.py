"""Bounded calls, what a call did, and assertions whose messages name the value, the expectation and the call.

Every message has one shape (array-api-tests'): `{name}={actual}, but should be {expected} [{call}]`.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import psutil
import torch
from torch.distributed.checkpoint import CheckpointException

__all__ = [
    "HUNG",
    "BoundExceeded",
    "Outcome",
    "assert_each_rank",
    "assert_equal",
    "assert_state_dict_equal",
    "attempt",
    "bounded",
    "outcome_of",
]

T = TypeVar("T")

HUNG = "hung"
"""Outcome.text of a call still running at its bound."""


class BoundExceeded(AssertionError):
    """A call did not return within the spec's bound (an AssertionError: the test fails where it is not caught)."""


def bounded(seconds: float, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """Run fn in a helper thread; raise BoundExceeded if it has not returned within `seconds` (the spec's bound).

    On timeout the thread is left behind, so the calling rank must be discarded (the runner does).
    """
    __tracebackhide__ = True
    value: list[T] = []  # what fn returned, once it has
    error: list[BaseException] = []

    def run() -> None:
        try:
            value.append(fn(*args, **kwargs))
        except BaseException as exc:  # CheckpointException is a BaseException
            error.append(exc)

    thread = threading.Thread(target=run, name=f"bounded:{what}", daemon=True)
    thread.start()
    thread.join(seconds)
    if thread.is_alive():
        raise BoundExceeded(f"{what} did not return within {seconds:g}s, but the spec bounds it\n{_where(thread)}")
    if error:
        raise error[0]
    return value[0]


def _where(thread: threading.Thread) -> str:
    """Where a call past its bound waits: its thread's innermost frames and this process's live descendants."""
    frame = sys._current_frames().get(thread.ident or -1)
    stack = "".join(traceback.format_stack(frame)[-8:]) if frame is not None else "  (thread gone)\n"
    lines = []
    for child in psutil.Process().children(recursive=True):
        try:
            lines.append(f"  pid {child.pid} {child.name()!r} {child.status()}, parent {child.ppid()}")
        except psutil.Error:
            continue
    return f"the call was at:\n{stack}live processes below this one:\n" + ("\n".join(lines) or "  none")


# ------------------------------------------------------------------------------------ outcomes


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What a call did: `text` is "returned", the class name of what it raised, or HUNG.

    `value` is what it returned, `message` the text of what it raised. `error` (the exception itself) stays in
    the process that made the call: exceptions need not pickle, so a rank's reply carries the rest only.
    """

    text: str
    value: Any = None
    message: str = ""
    error: BaseException | None = dataclasses.field(default=None, compare=False, repr=False)

    @property
    def returned(self) -> bool:
        return self.text == "returned"

    def __str__(self) -> str:
        return f"{self.text}: {self.message}" if self.message else self.text

    def __reduce__(self) -> tuple[type[Outcome], tuple[str, Any, str]]:
        return Outcome, (self.text, self.value, self.message)


def attempt(
    fn: Callable[..., object],
    *args: Any,
    bound: float | None = None,
    what: str = "",
    named: tuple[type[BaseException], ...] = (CheckpointException,),
    hung_fails: bool = False,
    **kwargs: Any,
) -> Outcome:
    """Call fn(*args, **kwargs), within `bound` seconds if given, and say what it did (never raises, but see below).

    An exception that is an instance of a class in `named` is reported by that class's name (implementations may
    raise subclasses), any other by its own class name. A call still running at its bound gives HUNG and goes on
    in a helper thread, possibly inside a collective: the rank must start no other collective and be discarded.
    `hung_fails=True` raises BoundExceeded instead, for ranks of a warm pool, which must not answer again.
    """
    __tracebackhide__ = True
    try:
        value = (
            bounded(bound, what or getattr(fn, "__name__", "call"), fn, *args, **kwargs)
            if bound is not None
            else fn(*args, **kwargs)
        )
    except BoundExceeded as exc:
        if hung_fails:
            raise
        return Outcome(HUNG, message=str(exc), error=exc)
    except BaseException as exc:  # CheckpointException is a BaseException
        name = next((cls.__name__ for cls in named if isinstance(exc, cls)), type(exc).__name__)
        return Outcome(name, message=str(exc), error=exc)
    return Outcome("returned", value)


def outcome_of(fn: Callable[..., object], *args: Any, **kwargs: Any) -> str:
    """attempt(fn, *args, **kwargs).text: "returned", the class name of what the call raised, or HUNG."""
    return attempt(fn, *args, **kwargs).text


# ---------------------------------------------------------------------------------- assertions


def _fields(value: object) -> dict[str, Any] | None:
    """The named fields of a dataclass instance or a NamedTuple, else None."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.compare}
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return dict(zip(value._fields, value, strict=True))
    return None


def _differences(name: str, actual: Any, expected: object) -> list[tuple[str, object, object]]:
    """(name, actual, expected) for every field or item that differs: named results (and lists of them) field by
    field, dicts with the same keys key by key, anything else by ==."""
    fields = _fields(expected)
    if fields is not None and type(actual) is type(expected):
        return [d for key, want in fields.items() for d in _differences(f"{name}.{key}", getattr(actual, key), want)]
    if (
        isinstance(expected, (list, tuple))
        and type(actual) is type(expected)
        and len(actual) == len(expected)
        and any(_fields(e) is not None for e in expected)
    ):
        pairs = zip(actual, expected, strict=True)
        return [d for i, (a, e) in enumerate(pairs) for d in _differences(f"{name}[{i}]", a, e)]
    if isinstance(expected, dict) and isinstance(actual, dict) and actual.keys() == expected.keys():
        return [d for key, want in expected.items() for d in _differences(f"{name}[{key!r}]", actual[key], want)]
    return [] if actual == expected else [(name, actual, expected)]


def _message(wrong: list[tuple[str, object, object]], call: str) -> str:
    where = f" [{call}]" if call else ""
    return "\n".join(f"{name}={actual!r}, but should be {expected!r}{where}" for name, actual, expected in wrong)


def assert_equal(name: str, actual: object, expected: object, *, call: str = "") -> None:
    """actual == expected, else one line per differing field: `name.field=..., but should be ... [call]`.

    Named results (dataclasses, NamedTuples, and lists of them) are compared field by field and dicts key by key,
    so that a failure names the field that differs rather than printing two unlabelled tuples.
    """
    __tracebackhide__ = True
    wrong = _differences(name, actual, expected)
    assert not wrong, _message(wrong, call)


def assert_each_rank(
    name: str, results: Sequence[object], expected: Any, *, per_rank: bool = False, call: str = ""
) -> None:
    """assert_equal for every rank's result (named `rank {r}: {name}`): all equal to `expected`, or with
    `per_rank=True` each to its own item of the list `expected`."""
    __tracebackhide__ = True
    wants = expected if per_rank else [expected] * len(results)
    assert len(results) == len(wants), f"len(results)={len(results)}, but should be {len(wants)} (ranks)"
    wrong = [
        d
        for rank, (got, want) in enumerate(zip(results, wants, strict=True))
        for d in _differences(f"rank {rank}: {name}", got, want)
    ]
    assert not wrong, _message(wrong, call)


def assert_state_dict_equal(actual: Any, expected: Any, *, call: str = "", path: str = "state_dict") -> None:
    """Equal structure, types, and tensors equal in dtype, shape and every element."""
    __tracebackhide__ = True
    where = f" [{call}]" if call else ""
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{path} is {type(actual).__name__}, but should be a Tensor{where}"
        assert actual.dtype == expected.dtype, f"{path}.dtype={actual.dtype}, but should be {expected.dtype}{where}"
        assert actual.shape == expected.shape, (
            f"{path}.shape={tuple(actual.shape)}, but should be {tuple(expected.shape)}{where}"
        )
        assert torch.equal(actual.cpu(), expected.cpu()), f"{path}={actual!r}, but should be {expected!r}{where}"
        return
    assert type(actual) is type(expected), (
        f"{path} is {type(actual).__name__}, but should be {type(expected).__name__}{where}"
    )
    if isinstance(expected, dict):
        assert actual.keys() == expected.keys(), (
            f"{path} keys={sorted(map(str, actual))}, but should be {sorted(map(str, expected))}{where}"
        )
        for key in expected:
            assert_state_dict_equal(actual[key], expected[key], call=call, path=f"{path}[{key!r}]")
    elif isinstance(expected, (list, tuple)):
        assert len(actual) == len(expected), f"len({path})={len(actual)}, but should be {len(expected)}{where}"
        for i, (a, e) in enumerate(zip(actual, expected, strict=True)):
            assert_state_dict_equal(a, e, call=call, path=f"{path}[{i}]")
    else:
        assert actual == expected, f"{path}={actual!r}, but should be {expected!r}{where}"
