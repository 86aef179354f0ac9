"""One run shared by a strict clause's test and its weak level's test, so that the weak level costs no second run.

`shared(tmp_path_factory, key, run)` calls `run()` the first time a test session asks for `key` and keeps what it
returned, or what it raised; every later request for `key` in that session gets the same value, or the same
exception raised again (so a weak test that reads a failed run fails with the strict test's own message, and skips
where it skipped). Under pytest-xdist the outcome is passed between workers through a pickle in the session's
temporary directory, under a file lock: a worker that asks while another makes the run waits for it, for at most
`wait` seconds (then the test fails, naming the key). An outcome that cannot be pickled is kept in its own process
only (another worker then makes the run again). What a run returns must not depend on anything only its worker has
(a fixture's server): it reads such things itself and returns the facts.

The spec areas and the fault suite (its scenarios of one save in a phase, the lost node) share runs through here.
"""

from __future__ import annotations

import fcntl
import os
import pickle
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

__all__ = ["SHARED_WAIT", "shared"]

SHARED_WAIT = 600.0  # seconds a test waits for another worker's run of the same key

T = TypeVar("T")
_RUNS: dict[str, tuple[str, Any]] = {}  # key -> ("returned" | "raised" | "skipped", value, exception or reason)


def _session_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of this session, the same for every xdist worker (each worker's base temp is a child of it)."""
    base = tmp_path_factory.getbasetemp()
    root = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    path = root / "shared-runs"
    path.mkdir(exist_ok=True)
    return path


def _make(run: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return ("returned", run())
    except (KeyboardInterrupt, SystemExit):
        raise
    except pytest.skip.Exception as exc:
        return ("skipped", str(exc))
    except BaseException as exc:  # CheckpointException and pytest's outcomes are BaseExceptions
        return ("raised", exc)


def _load(path: Path) -> tuple[str, Any] | None:
    try:
        entry: tuple[str, Any] = pickle.loads(path.read_bytes())
    except Exception:  # an exception class whose pickle does not load back: make the run here
        return None
    return entry


def _lock(lock: Any, key: str, wait: float) -> None:
    """Take the run's lock, or fail the test once another worker has held it for `wait` seconds."""
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # released when the file closes
            return
        except BlockingIOError:
            if time.monotonic() > deadline:
                pytest.fail(f"another worker's run of {key!r} held its lock past {wait:g}s")
            time.sleep(0.2)


def shared(tmp_path_factory: pytest.TempPathFactory, key: str, run: Callable[[], T], *, wait: float = SHARED_WAIT) -> T:
    """run()'s result for `key` (a file name), made once per session; an exception it raised is raised again."""
    __tracebackhide__ = True
    if key not in _RUNS:
        where = _session_dir(tmp_path_factory) / f"{key}.pickle"
        with open(where.with_suffix(".lock"), "a") as lock:
            _lock(lock, key, wait)
            entry = _load(where) if where.exists() else None
            if entry is None:
                entry = _make(run)
                try:
                    data = pickle.dumps(entry)
                except Exception:
                    data = b""
                if data:
                    partial = where.with_suffix(".partial")
                    partial.write_bytes(data)
                    partial.replace(where)
        _RUNS[key] = entry
    kind, value = _RUNS[key]
    if kind == "skipped":
        pytest.skip(value)
    if kind == "raised":
        raise value
    return value  # type: ignore[no-any-return]
