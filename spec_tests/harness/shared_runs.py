"""One run shared by a strict clause's test and its weak level's test, so that the weak level costs no second run.

`shared(tmp_path_factory, key, run)` calls `run()` the first time a test session asks for `key` and keeps what it
returned, or what it raised; every later request for `key` in that session gets the same value, or the same
exception raised again (so a weak test that reads a failed run fails with the strict test's own message, and skips
where it skipped). Under pytest-xdist the outcome is passed between workers through a pickle in the session's
temporary directory, under a file lock: a worker that asks while another makes the run waits for it. An outcome
that cannot be pickled is kept in its own process only (another worker then makes the run again).
"""

from __future__ import annotations

import fcntl
import os
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

__all__ = ["shared"]

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


def shared(tmp_path_factory: pytest.TempPathFactory, key: str, run: Callable[[], T]) -> T:
    """run()'s result for `key` (a file name), made once per session; an exception it raised is raised again."""
    __tracebackhide__ = True
    if key not in _RUNS:
        where = _session_dir(tmp_path_factory) / f"{key}.pickle"
        with open(where.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
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
