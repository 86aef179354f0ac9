"""The runner seam: which Runner runs this process's multi-rank bodies, and what tests call to run one.

    @ranks(2, timeout=60)                 # fresh ranks for one test
    def test_x(target, tmp_path): ...     # module-level; the body runs on every rank

    def test_y(rank_pool):                # warm ranks, reused across hypothesis examples
        results = rank_pool(2).run(body, arg)   # body: a module-level function

The runner is chosen once, at configuration (`use_runner`), as pytest-xdist chooses its scheduler: the forked runner
(ckptspec.spec.harness.ranks.forked) by default, the launched runner (ckptspec.spec.harness.ranks.launched) under torchrun.
A run that declares a death (`expect_exit`) is forked whatever the runner: a rank killed on purpose would end a
launched job.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from ckptspec.spec.harness.ranks.forked import FORKED
from ckptspec.spec.harness.ranks.vocabulary import DEFAULT_TIMEOUT, Runner

__all__ = ["RankPool", "ranks", "resolve_backend", "run_on_ranks", "use_runner"]

_runner: Runner = FORKED


def use_runner(runner: Runner | None) -> None:
    """Hand every multi-rank body of this process to `runner` (None: the forked runner, the default).

    Chosen once, at configuration (the launched mode registers its driver), as pytest-xdist chooses its scheduler.
    """
    global _runner
    _runner = runner or FORKED


def resolve_backend(backend: str, world_size: int) -> str:
    """The process-group backend the runner in use gives a run asking for `backend` on `world_size` ranks."""
    return _runner.resolve_backend(backend, world_size)


def run_on_ranks(
    fn: Callable[..., Any],
    world_size: int,
    args: tuple[Any, ...] = (),
    kwargs: dict[str, Any] | None = None,
    *,
    backend: str = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    expect_exit: dict[int, int] | None = None,
    unwrap: bool = False,
) -> list[Any]:
    """Run fn(*args, **kwargs) once on fresh ranks; return each rank's result.

    A run that declares a death (`expect_exit`) is forked here whatever the runner: a rank killed on purpose would
    end a launched job.
    """
    __tracebackhide__ = True
    if expect_exit:
        _runner.note_forked()
        backend = resolve_backend(backend, world_size)  # the runner in use decides, as for any run
        return FORKED.run(
            fn, world_size, args, kwargs, backend=backend, timeout=timeout, unwrap=unwrap, expect_exit=expect_exit
        )
    return _runner.run(fn, world_size, args, kwargs, backend=backend, timeout=timeout, unwrap=unwrap)


def ranks(
    world_size: int,
    *,
    backend: str = "auto",
    timeout: float = DEFAULT_TIMEOUT,
    expect_exit: dict[int, int] | None = None,
) -> Callable[[Callable[..., object]], Callable[..., None]]:
    """Decorator: run a module-level test body on `world_size` fresh ranks."""

    def decorate(fn: Callable[..., object]) -> Callable[..., None]:
        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> None:
            __tracebackhide__ = True
            run_on_ranks(
                fn, world_size, args, kwargs, backend=backend, timeout=timeout, expect_exit=expect_exit, unwrap=True
            )

        return wrapper

    return decorate


class RankPool:
    """`world_size` warm ranks sharing one process group; respawned after any failure (by the runner in use)."""

    def __init__(self, world_size: int, backend: str = "auto", timeout: float = DEFAULT_TIMEOUT):
        self.world_size, self.timeout = world_size, timeout
        self.backend = resolve_backend(backend, world_size)
        self._ranks: Any = None  # the forked runner's warm ranks (forked._Ranks), kept between runs

    def run(self, fn: Callable[..., Any], *args: Any, timeout: float | None = None, **kwargs: Any) -> list[Any]:
        """Run fn(*args, **kwargs) on every rank; return the per-rank results."""
        __tracebackhide__ = True
        timeout = self.timeout if timeout is None else timeout
        return _runner.run(fn, self.world_size, args, kwargs, backend=self.backend, timeout=timeout, pool=self)

    def close(self) -> None:
        _runner.close_pool(self)
