"""One run of a fault scenario per test session, shared by the tests that judge it (a strict clause and its weak
level).

Under pytest-xdist the two tests may land on two workers: the first to ask runs the scenario, while the other
waits on a lock for its result, which is pickled into the session's shared temporary directory (the parent of
every worker's own). Without xdist the result is kept in this process. A scenario that raises (a skip, a rank that
failed) stores nothing: the next test to ask runs it again. What a scenario returns must be picklable and must not
depend on anything only its worker has (a fixture's server): it reads such things itself and returns the facts.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pytest

__all__ = ["SHARED_WAIT", "shared_run"]

SHARED_WAIT = 600.0  # seconds a test waits for another worker's run of the same scenario
T = TypeVar("T")
_KEPT: dict[str, Any] = {}


def shared_run(tmp_path_factory: pytest.TempPathFactory, key: str, make: Callable[[str], T]) -> T:
    """make(a new directory)'s result, made once per session for `key` (a name that is safe in a file name)."""
    if key in _KEPT:
        return _KEPT[key]
    run_id = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if run_id is None:
        _KEPT[key] = make(str(tmp_path_factory.mktemp(key)))
        return _KEPT[key]
    shared = tmp_path_factory.getbasetemp().parent  # popen-gwN's parent: one directory per xdist session
    result = shared / f"{key}-{run_id}.pickle"
    with open(shared / f"{key}-{run_id}.lock", "w") as lock:
        deadline = time.monotonic() + SHARED_WAIT
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    pytest.fail(f"another worker's run of the scenario {key!r} held its lock past {SHARED_WAIT:g}s")
                time.sleep(0.2)
        if result.exists():
            value = pickle.loads(result.read_bytes())
        else:
            value = make(str(tmp_path_factory.mktemp(key)))
            result.write_bytes(pickle.dumps(value))
    _KEPT[key] = value
    return value
