"""Ranks run each in a private TMPDIR inside the running test's audited one.

The fault suite's orphan audit (ckptspec/faults/conftest.py) gives each test a private TMPDIR (`current_tmpdir`) and
fails the test if anything is left there. `on_ranks` runs ranks each with a TMPDIR of its own inside it, also ranks
killed on purpose; outside the fault suite (no audit) it runs them with the machine's TMPDIR.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from typing import Any

from ckptspec.spec.drivers.bounds import EXIT_BOUND
from ckptspec.spec.harness import run_on_ranks
from ckptspec.spec.harness.ranks.reaper import collect_garbage

__all__ = ["audited_tmpdir", "current_tmpdir", "on_ranks", "private_tmpdir"]

current_tmpdir: str | None = None
"""The running test's private TMPDIR, set by the audit fixture (ckptspec/faults/conftest.py)."""


def on_ranks(
    world_size: int,
    fn: Callable[..., Any],
    *args: Any,
    timeout: float = 120,
    expect_exit: dict[int, int] | None = None,
    backend: str = "auto",
) -> list[Any]:
    """run_on_ranks(fn, ...) on fresh ranks, each with its own TMPDIR inside the test's private one.

    The audit inspects every rank's TMPDIR, also of ranks killed on purpose (expect_exit): a target
    may keep no temporary file outside its checkpoint that a killed trainer could not remove. Tests that
    kill a rank pass backend="gloo" (see clause FI-GPU-2); the others run over NCCL where there is a GPU per rank.
    """
    __tracebackhide__ = True
    return run_on_ranks(
        _in_test_env, world_size, (current_tmpdir, fn, *args), timeout=timeout, expect_exit=expect_exit, backend=backend
    )


def audited_tmpdir() -> str | None:
    """The running test's private TMPDIR, which the orphan audit inspects; None where no audit runs."""
    return os.environ.get("CKPTSPEC_FI_TMPDIR") or current_tmpdir


def private_tmpdir(name: str, base: str | None = None) -> None:
    """Point this process's TMPDIR (and its children's) at `name` inside `base`, by default the test's audited
    TMPDIR; never directly in the machine's temporary directory, where nothing would remove it."""
    root = base or audited_tmpdir()
    if root is None:
        raise ValueError(f"private_tmpdir({name!r}): no audited TMPDIR and no base directory")
    path = os.path.join(root, name)
    os.makedirs(path, exist_ok=True)
    os.environ["TMPDIR"] = path
    tempfile.tempdir = None  # recomputed from TMPDIR on next use


def _in_test_env(tmpdir: str | None, fn: Callable[..., Any], *args: Any) -> Any:
    if tmpdir is not None:
        os.environ["CKPTSPEC_FI_TMPDIR"] = tmpdir
        private_tmpdir(f"rank{os.environ['RANK']}")
    try:
        return fn(*args)
    finally:
        # The runner stops a rank right after its reply, before interpreter exit would collect what the body dropped.
        collect_garbage(EXIT_BOUND)
