"""The vocabulary of a rank run, shared by every runner: per-rank state, outcomes, the failure report, a job.

A runner runs a module-level function on N ranks and answers with each rank's result or one `RankFailures`
covering every rank. The forked runner (`ckptspec.spec.harness.ranks.forked`) is the default; under a launcher (torchrun) the launched
runner (`ckptspec.spec.harness.ranks.launched`) registers itself with `ranks.use_runner`, and the bodies run on the
launched ranks. Both build their answer from the names here, so a failure reads the same whoever ran it.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "DEFAULT_TIMEOUT",
    "DUMP_WAIT",
    "GRACE_AFTER_FAILURE",
    "Job",
    "RankFailures",
    "RankOutcome",
    "Runner",
    "finish",
    "job_of",
    "rank_state",
    "world",
]

DEFAULT_TIMEOUT = 120.0
GRACE_AFTER_FAILURE = 3.0
DUMP_WAIT = 2.0

rank_state: dict[Hashable, Any] = {}
"""Per-rank state kept between runs of one RankPool (empty in a fresh rank)."""

Job = tuple[str, str, bool, tuple[Any, ...], dict[str, Any]]
"""What a rank needs to run a function (`job_of`): (module, qualname, unwrap, args, kwargs)."""


class RankFailures(AssertionError):
    """One or more ranks failed, hung or exited unexpectedly; the message covers every rank."""


def world() -> tuple[int, int]:
    import torch.distributed as dist

    return dist.get_rank(), dist.get_world_size()


class Runner(Protocol):
    """What `ranks` hands every multi-rank body to: the forked runner (the default) or the launched one, chosen once."""

    def resolve_backend(self, backend: str, world_size: int) -> str:
        """The process-group backend a run asking for `backend` on `world_size` ranks gets (or skip the test)."""
        ...

    def run(
        self,
        fn: Any,
        world_size: int,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        *,
        backend: str = "auto",
        timeout: float,
        unwrap: bool = False,
        pool: Any = None,
    ) -> list[Any]:
        """Run fn(*args, **kwargs) on ranks 0..world_size-1; each rank's result, or RankFailures.

        `pool` is the RankPool the run belongs to (its ranks and rank_state kept between runs), None for one run.
        """
        ...

    def close_pool(self, pool: Any) -> None:
        """Release what the runner keeps for `pool`."""
        ...

    def note_forked(self) -> None:
        """Record that the current test forked its own ranks (it expects a rank to die) instead of using this runner."""
        ...


@dataclass
class RankOutcome:
    """What one rank did in a run: its reply (`detail`: result, traceback or skip reason), exit code or stack."""

    kind: str = "pending"  # ok | error | skip | exit | expected_exit | hung
    detail: object = None


def _describe(outcomes: list[RankOutcome], timeout: float, expect_exit: dict[int, int]) -> str | None:
    """The RankFailures text, or None if every rank did what was expected."""
    bad, lines = 0, []
    for rank, o in enumerate(outcomes):
        if o.kind == "error":
            text = f"rank {rank} raised\n{_indent(o.detail)}"
        elif o.kind == "exit":
            want = f" (expected {expect_exit[rank]})" if rank in expect_exit else ""
            text = f"rank {rank} exited with code {o.detail}{want} without reporting a result"
        elif o.kind == "hung":
            text = (
                f"rank {rank} did not finish within {timeout:g}s (or was stopped after another "
                f"rank failed); stack:\n{_indent(o.detail)}"
            )
        elif rank in expect_exit and o.kind != "expected_exit":
            text = f"rank {rank} was expected to exit with code {expect_exit[rank]} but returned"
        else:
            lines.append(f"rank {rank}: {o.kind}")
            continue
        bad += 1
        lines.append(text)
    if not bad:
        return None
    return f"{bad} of {len(outcomes)} ranks failed:\n\n" + "\n\n".join(lines)


def _indent(text: object) -> str:
    return "\n".join("    " + line for line in str(text).rstrip().splitlines())


def finish(outcomes: list[RankOutcome], timeout: float, expect_exit: dict[int, int]) -> list[Any]:
    """Each rank's result; RankFailures if any rank failed, hung or exited unexpectedly; a skip if a rank skipped."""
    import pytest

    __tracebackhide__ = True
    message = _describe(outcomes, timeout, expect_exit)
    if message:
        raise RankFailures(message)
    skips = [o.detail for o in outcomes if o.kind == "skip"]
    if skips:
        pytest.skip(str(skips[0]))
    return [o.detail if o.kind == "ok" else None for o in outcomes]


def job_of(fn: Any, unwrap: bool, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Job:
    """What a rank needs to run fn: (module, qualname, unwrap, args, kwargs); fn must be module-level."""
    if "<locals>" in fn.__qualname__:
        raise TypeError(f"{fn.__qualname__} must be a module-level function to run on ranks")
    return (fn.__module__, fn.__qualname__, unwrap, args, kwargs)
