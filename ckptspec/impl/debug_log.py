"""Timing and debug messages under a stack of names and loggers (NVRx's ``checkpointing.utils`` helpers).

``logger_stack(name, logger)`` pushes a name and/or a logger for the duration of a ``with`` block and yields
``(dotted names of the stack, innermost logger)``; without any logger pushed, ``fallback_logger``.
``debug_time(name, logger=None, threshold=-inf, level=None)`` logs ``"<names> took <s>s"`` when the block took at
least ``threshold`` seconds, at ``level`` (DEBUG without a threshold, WARNING with one). ``debug_msg(msg)`` logs
``"<names> <msg>"`` at DEBUG. The stack belongs to the process (NVRx's does too), not to a thread.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["debug_msg", "debug_time", "fallback_logger", "logger_stack"]

fallback_logger = logging.getLogger(__name__)
_names: list[str] = []
_loggers: list[logging.Logger] = []


@contextmanager
def logger_stack(
    name: str | None = None, current_logger: logging.Logger | None = None
) -> Iterator[tuple[str, logging.Logger]]:
    """Push ``name`` and ``current_logger`` (either may be None) while the block runs."""
    if name:
        _names.append(name)
    if current_logger:
        _loggers.append(current_logger)
    try:
        yield ".".join(_names), _loggers[-1] if _loggers else fallback_logger
    finally:
        if name and _names:
            _names.pop()
        if current_logger and _loggers:
            _loggers.pop()


@contextmanager
def debug_time(
    name: str, logger: logging.Logger | None = None, threshold: float = float("-inf"), level: int | None = None
) -> Iterator[None]:
    """Log how long the block took (see the module docstring)."""
    with logger_stack(name, logger) as (names, log):
        start = time.monotonic()
        try:
            yield
        finally:
            took = time.monotonic() - start
            if took >= threshold:
                if level is None:
                    level = logging.DEBUG if threshold == float("-inf") else logging.WARNING
                log.log(level, "%s took %.4fs", names, took)


def debug_msg(msg: str) -> None:
    """Log ``msg`` at DEBUG, after the names of the stack, to its innermost logger."""
    with logger_stack() as (names, log):
        log.debug("%s %s", names, msg)
