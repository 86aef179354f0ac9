"""Where a save's time goes: named marks on the wall clock, off unless a benchmark turns them on.

With ``CKPTSPEC_IMPL_PHASES`` set to a file path when a process starts, each process of a save (the trainer and
the worker it starts, which inherits the environment) appends one line per mark to that file:
``<name> <time.time()> <pid>``, tab-separated, in one ``O_APPEND`` write (whole lines, whatever the order). Unset,
``mark`` is one test of a module global: nothing is timed, opened or written.

The marks of one save, in order: ``plan`` and ``planned`` (``save_state_dict_async_plan``; between them, on a
repeated save that reuses its plan, ``fingerprinted`` (the state dict compared with the previous save's),
``buckets`` (the writer's buckets filled) and ``agreed`` (every rank's answer known)), ``copies`` (the
trainer starts copying into the slab), ``snapshot`` (every copy made), ``handed over`` (the request is on the
worker's pipe; before ``copies`` where the worker writes as the copies land), ``first byte`` and ``last byte``
(each file of the writer: the first item begun, the last item written), ``durable`` (every file fsynced, the
directory too), ``finalize`` and ``finalized`` (``save_state_dict_async_finalize``), ``committed`` (the coordinator's
``.metadata`` in place). A mark made by several threads or ranks appears once per maker.
"""

from __future__ import annotations

import os
import time

__all__ = ["ENV", "mark"]

ENV = "CKPTSPEC_IMPL_PHASES"
_path = os.environ.get(ENV) or None


def mark(name: str) -> None:
    """Append the mark ``name`` with the time now, if marks are on (module docstring)."""
    if _path is None:
        return
    line = f"{name}\t{time.time():.6f}\t{os.getpid()}\n".encode()
    fd = os.open(_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)
