"""The protocol interface (ckptspec.spec.harness.surface.saver_api) over an NVRx-shaped API: the recipe of the NVRx guide (000).

Each save is the documented recipe (ckptspec.spec.harness.surface.recipe: `FileSystemWriterAsync`, `save_state_dict_async_plan`,
an `AsyncRequest` finalized by `save_state_dict_async_finalize`), scheduled on one `AsyncCallsQueue`. The adapters
of impl, nvrx and mcore pass their own three modules; nothing here knows a target's internals: an adapter whose
queue takes more constructor options, or has a documented staging signal (a method the trainer calls before it
next changes the tensors), names them (`queue_options`, `staging_signal`), and `staged()` calls that method.
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
    ):
        self.modules = modules
        options = dict(queue_options or {})
        if persistent is not None:
            options["persistent"] = persistent
        self.queue = modules.core.AsyncCallsQueue(**options)
        self.staging_signal = staging_signal
        self.started = self.finalized = 0

    def start(self, state_dict: dict[str, Any], path: str) -> SaveHandle:
        self.queue.schedule_async_request(plan_async_save(self.modules, state_dict, path, thread_count=1).request())
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
) -> QueueSaver:
    """A QueueSaver over target `name`'s recipe modules, or over the importable `modules` given."""
    from ckptspec.spec.harness.surface.loading import load_target

    return QueueSaver(recipe_modules(load_target(name), modules), persistent, queue_options, staging_signal)
