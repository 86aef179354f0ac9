"""The protocol interface (spec_tests.harness.protocol) over an NVRx-shaped API: the recipe of the NVRx guide (000).

Each save is the documented recipe (spec_tests.harness.recipe: `FileSystemWriterAsync`, `save_state_dict_async_plan`,
an `AsyncRequest` finalized by `save_state_dict_async_finalize`), scheduled on one `AsyncCallsQueue`. The adapters
of impl, nvrx and mcore pass their own three modules; nothing here knows a target's internals.
"""

from __future__ import annotations

from spec_tests.harness.protocol import SaveHandle, Saver
from spec_tests.harness.recipe import RecipeModules, plan_async_save, recipe_modules


class _QueueHandle(SaveHandle):
    def __init__(self, saver: QueueSaver, number: int):
        self.saver, self.number = saver, number

    def wait(self) -> None:
        # A blocking finalize finalizes every pending call (002), so one call covers every earlier save too.
        if self.saver.finalized < self.number:
            self.saver.queue.maybe_finalize_async_calls(blocking=True, no_dist=False)
            self.saver.finalized = self.saver.started

    def abort(self) -> None:
        self.saver.queue.close(abort=True)


class QueueSaver(Saver):
    """One AsyncCallsQueue (the target's default caller unless `persistent` is given)."""

    def __init__(self, modules: RecipeModules, persistent: bool | None = None):
        self.modules = modules
        core = modules.core
        self.queue = core.AsyncCallsQueue() if persistent is None else core.AsyncCallsQueue(persistent=persistent)
        self.started = self.finalized = 0

    def start(self, state_dict: dict, path: str) -> SaveHandle:
        self.queue.schedule_async_request(plan_async_save(self.modules, state_dict, path, thread_count=1).request())
        self.started += 1
        return _QueueHandle(self, self.started)

    def close(self) -> None:
        self.queue.close()


def saver_of(name: str, persistent: bool | None = None, modules: tuple[str, ...] | None = None) -> QueueSaver:
    """A QueueSaver over target `name`'s recipe modules, or over the importable `modules` given."""
    from spec_tests.harness.targets import load_target

    return QueueSaver(recipe_modules(load_target(name), modules), persistent=persistent)
