"""The clauses' time bounds, in seconds: one list for the spec areas, the fault suite and the benchmarks.

A call of the protocol, the manager or the async core must return, raise, or have its processes gone within these;
`ckptspec.spec.harness.asserts.bounded`/`attempt` hold a call to one. The local driver's BOUND (drivers/local.py) is
its own: any one collective call of a local manager.
"""

from __future__ import annotations

__all__ = ["BOUND", "EXIT_BOUND", "WARM_BOUND"]

BOUND = 30.0
"""Seconds for a wait, an error or a save's completion, and for a fault to surface as an error on every rank (as PC-5
and AQ-7)."""
EXIT_BOUND = 10.0
"""Seconds for processes to be gone after abort, close or trainer death (as PC-4 and AQ-11)."""
WARM_BOUND = 120.0
"""Seconds for a saver's or a manager's first save, which starts its workers (spawning a process that imports torch
can take tens of seconds on a loaded machine); the clauses' bounds apply to the saves after it."""
