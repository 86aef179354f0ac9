"""A protocol adapter that is impl made slower by a known factor: the cost gate's yardstick (docs/benchmarks-ci.md).

    CKPTSPEC_SLOWDOWN=1.5 python -m ckptspec.bench.regression compare BASELINE   # a baseline recorded with
                                                                           # --impl ckptspec.bench.slowed_adapter

Each call of impl's protocol saver that the trainer waits for (`start`, `staged`, `wait`) takes FACTOR times as
long: after the real call, the adapter sleeps (FACTOR - 1) times what the call took. The stall and time-to-durable
figures of the regression set grow by FACTOR, and the goodput loop by what those calls weigh in it; loading is
unchanged (it reads the checkpoint without the saver). FACTOR is $CKPTSPEC_SLOWDOWN (default 1: impl as it is).
$CKPTSPEC_EXTRA_FSYNCS=N (default 0) adds N fsyncs of the checkpoint's directory to each save's `wait`: a counted
cost more, the paired gate's yardstick for counted figures.
Only the protocol capability: the regression pass measures this adapter's saver and nothing else.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from ckptspec.spec.harness import load_target
from ckptspec.spec.harness.surface.saver_api import SaveHandle, Saver

NAME = "slowed-impl"
DISTRIBUTION = None  # the source tree: the report shows no version
MODULES: dict[str, str] = {}
CAPABILITIES = frozenset({"protocol"})
EXPECTATIONS = None
SLOWDOWN_ENV = "CKPTSPEC_SLOWDOWN"
EXTRA_FSYNCS_ENV = "CKPTSPEC_EXTRA_FSYNCS"

T = TypeVar("T")


def factor() -> float:
    """The slowdown factor of $CKPTSPEC_SLOWDOWN (ValueError below 1)."""
    value = float(os.environ.get(SLOWDOWN_ENV) or 1)
    if value < 1:
        raise ValueError(f"${SLOWDOWN_ENV}={value:g}: a slowdown factor is at least 1")
    return value


def slowed(call: Callable[[], T]) -> T:
    """call(), then a sleep of (factor() - 1) times what it took."""
    start = time.perf_counter()
    result = call()
    time.sleep((factor() - 1) * (time.perf_counter() - start))
    return result


def extra_fsyncs() -> int:
    """The fsyncs each save adds, from $CKPTSPEC_EXTRA_FSYNCS (ValueError below 0)."""
    value = int(os.environ.get(EXTRA_FSYNCS_ENV) or 0)
    if value < 0:
        raise ValueError(f"${EXTRA_FSYNCS_ENV}={value}: a count of fsyncs is at least 0")
    return value


class _Handle(SaveHandle):
    def __init__(self, inner: SaveHandle, path: str) -> None:
        self._inner = inner
        self._path = path

    def staged(self) -> None:
        slowed(self._inner.staged)

    def wait(self) -> Any:
        result = slowed(self._inner.wait)
        for _ in range(extra_fsyncs()):
            fd = os.open(self._path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        return result

    def abort(self) -> None:
        self._inner.abort()


class SlowedSaver(Saver):
    def __init__(self, inner: Saver) -> None:
        self._inner = inner

    def start(self, state_dict: dict[str, Any], path: str) -> SaveHandle:
        return _Handle(slowed(lambda: self._inner.start(state_dict, path)), path)

    def close(self) -> None:
        self._inner.close()


def protocol_saver(**options: Any) -> SlowedSaver:
    """impl's protocol saver with the same options, slowed by $CKPTSPEC_SLOWDOWN."""
    return SlowedSaver(load_target("impl").adapter.protocol_saver(**options))
