"""The protocol interface (spec_tests.harness.protocol) over an NVRx-shaped API: the recipe of the NVRx guide (000).

`FileSystemWriterAsync` + `save_state_dict_async_plan` build an `AsyncRequest` whose finalize function is
`save_state_dict_async_finalize`; an `AsyncCallsQueue` schedules it. The adapters of impl, nvrx and mcore pass
their own three modules; nothing here knows a target's internals.
"""

from __future__ import annotations

import functools
from types import ModuleType

from spec_tests.harness.protocol import SaveHandle, Saver


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

    def __init__(self, core: ModuleType, writers: ModuleType, saver: ModuleType, persistent: bool | None = None):
        self.core, self.writers, self.saver = core, writers, saver
        self.queue = core.AsyncCallsQueue() if persistent is None else core.AsyncCallsQueue(persistent=persistent)
        self.started = self.finalized = 0

    def start(self, state_dict: dict, path: str) -> SaveHandle:
        from torch.distributed.checkpoint import DefaultSavePlanner

        writer = self.writers.FileSystemWriterAsync(path, thread_count=1)
        planned = self.saver.save_state_dict_async_plan(state_dict, writer, None, 0, planner=DefaultSavePlanner())
        save_fn, preload_fn, save_args = writer.get_save_function_and_args()
        # Megatron-Core returns ((writer, metadata, dist_wrapper), plan, reused), NVRx the inner triple.
        finalize_args = planned[0] if isinstance(planned[0], tuple) else planned
        finalize = functools.partial(self.saver.save_state_dict_async_finalize, *finalize_args)
        request = self.core.AsyncRequest(save_fn, tuple(save_args), [finalize], preload_fn=preload_fn)
        self.queue.schedule_async_request(request)
        self.started += 1
        return _QueueHandle(self, self.started)

    def close(self) -> None:
        self.queue.close()


SPEC_PATHS = ("async_ckpt.core", "async_ckpt.filesystem_async", "async_ckpt.state_dict_saver")


def saver_of(name: str, persistent: bool | None = None, modules: tuple[str, ...] | None = None) -> QueueSaver:
    """A QueueSaver over target `name`'s modules for SPEC_PATHS, or over the importable `modules` given."""
    import importlib

    from spec_tests.harness.targets import load_target

    target = load_target(name)
    found = [importlib.import_module(m) for m in modules] if modules else [target.module(p) for p in SPEC_PATHS]
    core, writers, saver = found
    return QueueSaver(core, writers, saver, persistent=persistent)
