"""The documented async save recipe (NVRx guide, seed 000), written once for every caller in the suite.

    writer = FileSystemWriterAsync(path, ...)
    planned = save_state_dict_async_plan(state_dict, writer, None, 0, planner=...)
    save_fn, preload_fn, save_args = writer.get_save_function_and_args()
    finalize_fn = partial(save_state_dict_async_finalize, *planned)
    request = AsyncRequest(save_fn, save_args, [finalize_fn], preload_fn=preload_fn)

`plan_async_save` does the first four lines with a target's (or any importable) modules and returns the parts as a
`PlannedSave`; `PlannedSave.request` builds the AsyncRequest, with any part replaced (a gate before the write, a
fault in one phase). The protocol adapters of impl, NVRx and Megatron-Core, the storage drivers, the fault suite's
saves and the benchmarks' writer peer all save through it, so a change of the recipe is one change.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any, NamedTuple

__all__ = ["PlannedSave", "RecipeModules", "plan_async_save", "planned_save", "recipe_modules"]

SPEC_PATHS = ("async_ckpt.core", "async_ckpt.filesystem_async", "async_ckpt.state_dict_saver")
"""The spec module paths of the recipe's three modules, in RecipeModules order."""


class RecipeModules(NamedTuple):
    """The three modules the recipe uses: AsyncRequest's, FileSystemWriterAsync's and the async saver's."""

    core: ModuleType
    writers: ModuleType
    saver: ModuleType


def recipe_modules(target: Any = None, modules: tuple[str, ...] | None = None) -> RecipeModules:
    """The recipe's modules: the importable `modules` given (core, writers, saver), else `target`'s SPEC_PATHS
    (the current target when `target` is None)."""
    if modules is not None:
        core, writers, saver = (importlib.import_module(m) for m in modules)
        return RecipeModules(core, writers, saver)
    if target is None:
        from ckptspec.spec.harness.surface.loading import current_target

        target = current_target()
    core, writers, saver = (target.module(path) for path in SPEC_PATHS)
    return RecipeModules(core, writers, saver)


@dataclass(frozen=True)
class PlannedSave:
    """One planned save: the writer, the three parts of `get_save_function_and_args()` and the bound finalize."""

    modules: RecipeModules
    writer: Any
    save_fn: Callable[..., Any] | None
    preload_fn: Callable[..., Any] | None
    save_args: tuple[Any, ...]
    finalize_fn: Callable[[], Any]

    def but(self, **parts: Any) -> PlannedSave:
        """The same save with some parts replaced (save_fn, preload_fn, save_args, finalize_fn)."""
        return replace(self, **parts)

    def request(self) -> Any:
        """The AsyncRequest of the recipe: save_fn(*save_args) in the background, finalize_fn once every rank's
        call is done, preload_fn (when there is one) at scheduling."""
        return self.modules.core.AsyncRequest(
            self.save_fn, tuple(self.save_args), [self.finalize_fn], preload_fn=self.preload_fn
        )


def plan_async_save(
    modules: RecipeModules,
    state_dict: Any,
    path: str | None = None,
    *,
    writer: Any = None,
    planner: Any = "default",
    plan_kwargs: dict[str, Any] | None = None,
    **writer_kwargs: Any,
) -> PlannedSave:
    """Plan a save of `state_dict` to `path` through `modules`; see the module docstring.

    `writer`: a FileSystemWriterAsync the caller made (else one is made for `path` with `writer_kwargs`).
    `planner`: the save planner; "default" passes torch's DefaultSavePlanner, None passes none (the library's own
    default). `plan_kwargs`: more keyword arguments of save_state_dict_async_plan.
    """
    if writer is None:
        if path is None:
            raise TypeError("plan_async_save needs a path or a writer")
        writer = modules.writers.FileSystemWriterAsync(path, **writer_kwargs)
    elif writer_kwargs:
        raise TypeError(f"writer options {sorted(writer_kwargs)} given with a writer made by the caller")
    kwargs = dict(plan_kwargs or {})
    if planner == "default":
        from torch.distributed.checkpoint import DefaultSavePlanner

        kwargs.setdefault("planner", DefaultSavePlanner())
    elif planner is not None:
        kwargs["planner"] = planner
    return planned_save(modules, writer, modules.saver.save_state_dict_async_plan(state_dict, writer, **kwargs))


def planned_save(modules: RecipeModules, writer: Any, planned: Any) -> PlannedSave:
    """The PlannedSave of a plan the caller made (what save_state_dict_async_plan returned for `writer`)."""
    # Megatron-Core returns ((writer, metadata, dist_wrapper), plan, reused), NVRx the inner triple.
    finalize_args = planned[0] if isinstance(planned[0], tuple) else planned
    save_fn, preload_fn, save_args = writer.get_save_function_and_args()
    finalize_fn = functools.partial(modules.saver.save_state_dict_async_finalize, *finalize_args)
    return PlannedSave(modules, writer, save_fn, preload_fn, tuple(save_args), finalize_fn)
