"""One saver kept warm on a rank across the examples of a property test: `kept` makes it once per rank, `end_kept`
ends it, `examples_on_warm_ranks` runs a hypothesis search that way.

Without it, a test of a persistent caller starts a worker (a fresh interpreter importing torch, seconds of CPU) per
rank and example; with it, one per rank and test. A failed example respawns the pool's ranks (RankPool), so the
example after a failure starts from a new saver, as before.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from hypothesis import given
from hypothesis.strategies import SearchStrategy

from ckptspec.spec.harness.ranks.vocabulary import rank_state

__all__ = ["end_kept", "examples_on_warm_ranks", "kept"]

_T = TypeVar("_T")
_KEPT = "ckptspec-kept"


def kept(key: Hashable, make: Callable[[], _T]) -> _T:
    """(on a rank of a RankPool) This rank's object for `key`, made by `make()` at the first call and kept in the
    pool's `rank_state` until `end_kept`."""
    objects: dict[Hashable, Any] = rank_state.setdefault(_KEPT, {})
    if key not in objects:
        objects[key] = make()
    obj: _T = objects[key]
    return obj


def end_kept(end: Callable[[Any], object]) -> int:
    """(on every rank, the test's last run) `end(obj)` for each object `kept` made on this rank, forgotten first so
    that an error in one end is the test's failure and the rest are still ended; the number ended."""
    objects = rank_state.pop(_KEPT, {})
    errors = []
    for obj in objects.values():
        try:
            end(obj)
        except BaseException as exc:  # CheckpointException is a BaseException
            errors.append(exc)
    if errors:
        raise errors[0]
    return len(objects)


def examples_on_warm_ranks(
    pool: Any,
    examples: SearchStrategy[Any],
    body: Callable[..., Any],
    end: Callable[[Any], object],
    args: Callable[[Any], tuple[Any, ...]],
) -> None:
    """Run `body(*args(example))` on the ranks of `pool` (a RankPool) for each example hypothesis draws from
    `examples`, then `end_kept(end)` on every rank, whatever happened: what `body` `kept` serves every example.

    The search's failure is the test's, the clause it cites: where ending the savers fails too (a rank that dies at
    close), that failure is a note on it rather than in its place. Ending alone failing is the test's failure."""

    @given(examples)
    def example(value: Any) -> None:
        pool.run(body, *args(value))

    try:
        example()
    except BaseException as failure:  # pytest's outcomes are BaseExceptions too
        try:
            pool.run(end_kept, end)
        except BaseException as ending:
            failure.add_note(f"then ending the savers kept on the ranks failed too: {type(ending).__name__}: {ending}")
        raise
    pool.run(end_kept, end)
