"""The protocol interface (ckptspec.spec.harness.surface.saver_api) over an NVRx-shaped API: the recipe of the NVRx guide (000).

Each save is the documented recipe (ckptspec.spec.harness.surface.recipe: `FileSystemWriterAsync`, `save_state_dict_async_plan`,
an `AsyncRequest` finalized by `save_state_dict_async_finalize`), scheduled on one `AsyncCallsQueue`. The adapters
of impl, nvrx and mcore pass their own three modules; nothing here knows a target's internals: an adapter whose
queue takes more constructor options, or has a documented staging signal (a method the trainer calls before it
next changes the tensors), names them (`queue_options`, `staging_signal`), and `staged()` calls that method;
`plan_cache` plans with the documented plan cache (`enable_cache=True`), as a trainer whose state dict keeps its
structure does.
"""

from __future__ import annotations

from typing import Any

from ckptspec.spec.harness.surface.recipe import RecipeModules, plan_async_save, recipe_modules
from ckptspec.spec.harness.surface.saver_api import SaveHandle, Saver


class _QueueHandle(SaveHandle):
    def __init__(self, saver: QueueSaver, number: int):
        self.saver, self.number = saver, number

    def staged(self) -> None:
        if self.saver.staging_signal is not None:
            getattr(self.saver.queue, self.saver.staging_signal)()

    def wait(self) -> None:
        # A blocking finalize finalizes every pending call (002), so one call covers every earlier save too.
        if self.saver.finalized < self.number:
            self.saver.queue.maybe_finalize_async_calls(blocking=True, no_dist=False)
            self.saver.finalized = self.saver.started

    def abort(self) -> None:
        self.saver.queue.close(abort=True)


class QueueSaver(Saver):
    """One AsyncCallsQueue (the target's default caller unless `persistent` is given), built with `queue_options`;
    `staging_signal` names the queue's staging wait, if it has one."""

    def __init__(
        self,
        modules: RecipeModules,
        persistent: bool | None = None,
        queue_options: dict[str, Any] | None = None,
        staging_signal: str | None = None,
        plan_cache: bool = False,
    ):
        self.modules = modules
        # The documented plan cache (enable_cache=True), a cache of this saver's own, where the adapter asks for it.
        self.plan_kwargs = (
            {"enable_cache": True, "metadata_cache": modules.saver.CheckpointMetadataCache()} if plan_cache else None
        )
        options = dict(queue_options or {})
        if persistent is not None:
            options["persistent"] = persistent
        self.queue = modules.core.AsyncCallsQueue(**options)
        self.staging_signal = staging_signal
        self.started = self.finalized = 0

    def start(self, state_dict: dict[str, Any], path: str) -> SaveHandle:
        planned = plan_async_save(self.modules, state_dict, path, plan_kwargs=self.plan_kwargs, thread_count=1)
        self.queue.schedule_async_request(planned.request())
        self.started += 1
        return _QueueHandle(self, self.started)

    def close(self) -> None:
        self.queue.close()


def saver_of(
    name: str,
    persistent: bool | None = None,
    modules: tuple[str, ...] | None = None,
    queue_options: dict[str, Any] | None = None,
    staging_signal: str | None = None,
    plan_cache: bool = False,
) -> QueueSaver:
    """A QueueSaver over target `name`'s recipe modules, or over the importable `modules` given."""
    from ckptspec.spec.harness.surface.loading import load_target

    modules_ = recipe_modules(load_target(name), modules)
    return QueueSaver(modules_, persistent, queue_options, staging_signal, plan_cache)
