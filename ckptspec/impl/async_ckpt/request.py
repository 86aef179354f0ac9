"""``AsyncRequest``, and how the outcome of a background call is reported.

* ``AsyncRequest``: ``async_fn(*async_fn_args, **async_fn_kwargs)`` runs in the background;
  if ``preload_fn`` is set it takes no arguments and its result replaces positional argument 1.
  ``finalize_fns`` run in the trainer, in order, once the call is done on every rank.
* ``run_guarded`` catches an error where the call runs and returns it as a picklable value,
  so it can cross to the trainer and between ranks.
* ``raise_failure`` raises ``CheckpointException`` whose ``failures`` maps each failing rank to
  its exception: on every rank, after gathering the errors, when the check is collective.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from typing import Any, NamedTuple, cast

import torch
import torch.distributed as dist
from torch.distributed.checkpoint import CheckpointException

from ..utils import all_gather, all_reduce, dist_rank, dist_ready, errors_by_rank, picklable_error

__all__ = ["AsyncRequest", "CheckpointFailure", "raise_failure", "run_guarded"]


class AsyncRequest(NamedTuple):
    """One background call plus the functions that finalize it on every rank."""

    async_fn: Callable[..., object] | None
    async_fn_args: tuple[Any, ...]
    finalize_fns: list[Callable[[], object]]
    async_fn_kwargs: dict[str, Any] | None = None
    preload_fn: Callable[[], Any] | None = None
    is_frozen: bool = False
    call_idx: int = 0

    def add_finalize_fn(self, fn: Callable[[], object]) -> None:
        """Append ``fn`` to the finalize functions (not allowed once frozen)."""
        if self.is_frozen:
            raise RuntimeError("cannot add a finalize function to a frozen AsyncRequest")
        if not callable(fn):
            raise TypeError(f"finalize function must be callable, got {type(fn).__name__}")
        self.finalize_fns.append(fn)

    def freeze(self) -> AsyncRequest:
        """Return a frozen copy, equal in every field but ``is_frozen``, with its own list of finalize functions."""
        # A list equal to the original (AR-4), but not the same list: later additions to the original stay out (AR-5).
        return self._replace(is_frozen=True, finalize_fns=list(self.finalize_fns))

    def execute_sync(self) -> None:
        """Do in this process what the async path does: preload, call, barrier, finalize."""
        args = list(self.async_fn_args)
        if self.preload_fn is not None:
            args[1] = self.preload_fn()
        if self.async_fn is not None:
            self.async_fn(*args, **(self.async_fn_kwargs or {}))
        if dist_ready():
            dist.barrier()
        for fn in self.finalize_fns:
            fn()

    def execute_finalize_fns(self, validate_matching_call_idx: bool = True) -> int:
        """Run the finalize functions in order; return ``call_idx``. With ``validate_matching_call_idx`` (and
        torch.distributed initialized) every rank then checks, in one all-reduce, that all ranks finalized this
        same ``call_idx``, and raises RuntimeError on every rank if not."""
        for fn in self.finalize_fns:
            fn()
        if validate_matching_call_idx and dist_ready():
            top, neg_bottom = all_reduce([self.call_idx, -self.call_idx], dist.ReduceOp.MAX, torch.int64)
            if (top, -neg_bottom) != (self.call_idx, self.call_idx):
                raise RuntimeError(
                    f"ranks finalized different calls: this rank {self.call_idx}, others from {-neg_bottom} to {top}"
                )
        return self.call_idx


def run_guarded(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> tuple[Any, BaseException | None]:
    """Call ``fn``; return ``(result, None)`` or ``(None, picklable error)``."""
    try:
        return fn(*args, **kwargs), None
    except Exception as exc:
        err = picklable_error(exc)
        if err is exc:
            assert exc.__traceback__ is not None  # noqa: PT017 - it was raised; narrows the type (library code, no test)
            tb_text = "".join(traceback.format_tb(exc.__traceback__.tb_next))
            exc.add_note(f"Traceback in process {os.getpid()}:\n{tb_text}")
        # Drop the frames (and the tensors they reference) now; tracebacks do not pickle anyway.
        return None, err.with_traceback(None)


class CheckpointFailure(CheckpointException):
    """CheckpointException with plain exceptions as ``failures`` values, and a matching str()."""

    def __str__(self) -> str:
        # Plain exceptions, not the (exception, stack summary) pairs CheckpointException's annotation names.
        failures = cast("dict[int, BaseException]", self.failures)
        lines = [f"{self.args[0]} failed on rank(s) {sorted(failures)}"]
        for rank, exc in sorted(failures.items()):
            text = "".join(traceback.format_exception_only(exc)).rstrip()
            lines.append(f"[rank {rank}] {text}")
        return "\n".join(lines)


def raise_failure(what: str, local_err: BaseException | None, collective: bool) -> None:
    """Raise CheckpointFailure with every failing rank's error (gathered if ``collective``)."""
    failures: dict[int, Any]  # plain exceptions (see CheckpointFailure)
    if collective:
        failures = errors_by_rank(all_gather(local_err))
    else:
        assert local_err is not None  # callers raise a local failure only with its error
        failures = {dist_rank(): local_err}
    raise CheckpointFailure(what, failures) from local_err
