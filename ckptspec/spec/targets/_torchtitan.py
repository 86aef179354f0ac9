"""torchtitan's `CheckpointManager` behind the protocol layer: `TitanSaver(mode)` for either async mode; the adapter
`torchtitan` uses async_mode "async". Written against the documented adapter contract
(ckptspec.spec.harness.surface.contract), as an outside author would.

Two releases, one adapter; what differs is read from the installed package, not from its version:

- where the manager lives: `torchtitan/components/checkpointer/dcp.py` in 0.3.0 (its `components/checkpoint.py`
  is a shim re-exporting it), `torchtitan/components/checkpoint.py` in 0.2.2 (`titan_manager_class()`);
- how it is configured: 0.3.0's manager carries its own `CheckpointManager.Config` and takes it first; 0.2.2's
  takes the job config's `torchtitan.config.Checkpoint` as `checkpoint_config` (components/checkpoint.py:184-194)
  (`build_manager()`, branching on the class having a `Config`);
- how a save is awaited: 0.3.0's `maybe_wait_for_saving()` ("Block until the last asynchronous save completes");
  0.2.2 has no public wait: its `save()` starts with `_async_wait()` (components/checkpoint.py:508, 828-842), the
  wait for the previous save's future, and the adapter calls that (`wait_for_saving()`), the one private call.

"async_with_pinned_mem" is not a target here: torchtitan builds its DefaultStager with `use_pinned_memory=True`
and `use_non_blocking_copy=True` whatever the device, and torch 2.13's DefaultStager refuses that without an
accelerator ("Non-blocking copy requires that the current accelerator is available"), so on a CPU machine its
first save raises. An adapter for it is `TitanSaver("async_with_pinned_mem")`, for a GPU run.

The manager is built as torchtitan's trainer builds it, with small stand-ins for what its checkpoint code expects:
`model_parts` a one-layer `nn.Linear`, `optimizers` and `lr_schedulers` `Stateful` objects of one step counter
each, no dataloader, and `states` a dict the adapter fills with the state dict of each save (the trainer's
`train_state`). What a checkpoint holds is then torchtitan's own flattening of all of it: the test's keys beside
the stand-ins' (`_flattened_model_states_sd`), saved by `dcp.async_save` on the manager's gloo group.

The five calls, as torchtitan's trainer makes them (`torchtitan/trainer.py`):

- start(state, path): `save(step)` with a step one higher than the last, `interval=1` (every step is saved); save()
  first waits for the previous save (`maybe_wait_for_saving`), then dispatches this one and returns.
- staged(): `maybe_wait_for_staging()`, which the trainer calls right before `optimizers.step()`.
- wait(): `maybe_wait_for_saving()` (0.2.2: `_async_wait()`, what its save() calls first).
- abort(): none (the default raises NotImplementedError); torchtitan documents no way to stop a save.
- close(): `close()` ("Release background threads and other resources.").

The one change to the library: a checkpoint goes to the directory the test names instead of `<folder>/step-<N>`
(`_create_checkpoint_id` returns it), so faults placed there reach it; the format is DCP's. Retention
(`keep_latest_k`) therefore never sees a `step-<N>` directory: the protocol layer does not judge it. The manager
layer does: `TitanManager` (below) uses torchtitan's own `step-<N>` directories, retention and load.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import threading
import time
from collections.abc import Iterator
from typing import Any

from ckptspec.spec.harness.surface.manager_api import CheckpointManager
from ckptspec.spec.harness.surface.saver_api import SaveHandle, Saver

DISTRIBUTION = "torchtitan"
INSTALL = 'pip install "torch==2.13.0" -e ".[test,torchtitan]"'
MODULES: dict[str, str] = {}
PACKAGES = ("torchtitan",)
CAPABILITIES = frozenset({"protocol", "manager", "manager_retention", "manager_ranks"})
# How long one side of a forced order waits for the other (a save whose writer never creates its folder).
_HOLD = 30.0


class _Counter:
    """A Stateful stand-in (an optimizer or LR scheduler container): one step counter."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = state_dict["steps"]


def titan_manager_class() -> Any:
    """torchtitan's CheckpointManager where the installed release keeps it: `components/checkpointer/dcp.py` (0.3.0),
    else `components/checkpoint.py` (0.2.2)."""
    try:
        from torchtitan.components.checkpointer.dcp import CheckpointManager
    except ModuleNotFoundError as exc:
        if exc.name != "torchtitan.components.checkpointer":
            raise  # torchtitan itself, or one of its imports, is missing: not a question of the release
        from torchtitan.components.checkpoint import CheckpointManager
    return CheckpointManager


def build_manager(cls: Any, states: dict[str, Any], **config: Any) -> Any:
    """`cls` (a CheckpointManager or a subclass) built as torchtitan's trainer builds it, with `config` as its
    checkpoint configuration (enable, folder, interval, async_mode, keep_latest_k) and the stand-ins of the module's
    docstring: the class's own `Config` where it has one (0.3.0), else the job config's `Checkpoint` section passed as
    `checkpoint_config` (0.2.2)."""
    import torch

    parts = {
        "dataloader": None,
        "model_parts": [torch.nn.Linear(2, 2)],
        "optimizers": _Counter(),
        "lr_schedulers": _Counter(),
        "states": states,
        "sd_adapter": None,
    }
    if hasattr(cls, "Config"):
        return cls(cls.Config(**config), **parts)
    from torchtitan.config import Checkpoint

    return cls(checkpoint_config=Checkpoint(**config), **parts)


def wait_for_saving(manager: Any) -> None:
    """The wait for the last save: `maybe_wait_for_saving()` (0.3.0), else `_async_wait()` (0.2.2, what its save()
    calls first: `self.save_future.result()`, then `self.save_future = None`)."""
    wait = getattr(manager, "maybe_wait_for_saving", None)
    if wait is None:
        wait = manager._async_wait
    wait()


class _TitanHandle(SaveHandle):
    def __init__(self, saver: TitanSaver, step: int):
        self.saver, self.step = saver, step

    def staged(self) -> None:
        if self.saver.step == self.step:  # an earlier save was waited for when the next one started
            self.saver.manager.maybe_wait_for_staging()

    def wait(self) -> None:
        if self.saver.step == self.step:
            wait_for_saving(self.saver.manager)


class TitanSaver(Saver):
    """One CheckpointManager with async_mode `mode`, kept across saves as the trainer keeps it."""

    def __init__(self, mode: str):
        class _AtPath(titan_manager_class()):  # type: ignore[misc]
            target = ""

            def _create_checkpoint_id(self, step: int, folder: str = "") -> str:
                return self.target

        self.states: dict[str, Any] = {}
        self.components = set()
        self.manager = build_manager(_AtPath, self.states, enable=True, folder="unused", interval=1, async_mode=mode)
        self.components = set(self.states)  # model, optimizer, dataloader, lr_scheduler
        self.step = 0

    def start(self, state_dict: dict[str, Any], path: str) -> SaveHandle:
        for key in set(self.states) - self.components:
            del self.states[key]
        self.states.update(state_dict)
        self.step += 1
        self.manager.target = path
        self.manager.save(self.step)
        return _TitanHandle(self, self.step)

    def close(self) -> None:
        self.manager.close()


class TitanManager(CheckpointManager):
    """torchtitan's CheckpointManager as its trainer uses it: `folder` the root, `interval=1`, `keep_latest_k` the
    retention, async_mode "async"; checkpoints in `<root>/step-<N>` (its own naming, unchanged), resume through
    `load(step=-1)`.

    - save(step, state): `save(step)` with `state` in the manager's `states`; it waits for the previous save, starts
      `dcp.async_save` and queues retention (`_purge_stale_checkpoints`) before returning.
    - wait(): `maybe_wait_for_saving()` (0.2.2: `_async_wait()`). Retention runs on torchtitan's purge thread;
      close() joins it.
    - latest(): `_find_load_step()` (-1 is None), what `load(step=-1)` loads; resume(template): that step, then
      `load(step=-1)` into `template`'s keys; load(step, template): `load(step)`.
    - keep=1 is refused by torchtitan's config (ValueError: 'We need to maintain at least 2 checkpoint replicas').
    - retention_order(order): torchtitan's retention races with the write (see `_ordered`); each order is forced.
    """

    order: str | None = None  # the forced retention order (RETENTION_ORDERS), None: the race as it falls

    def __init__(self, root: str, keep: int):
        self.root = root
        self.states: dict[str, Any] = {}
        self.manager = build_manager(
            titan_manager_class(),
            self.states,
            enable=True,
            folder=root,
            interval=1,
            async_mode="async",
            keep_latest_k=keep,
        )
        self.components = set(self.states)

    def _use(self, state_dict: dict[str, Any]) -> None:
        for key in set(self.states) - self.components:
            del self.states[key]
        self.states.update(state_dict)

    def save(self, step: int, state_dict: dict[str, Any]) -> None:
        self._use(state_dict)
        if self.order is None:
            self.manager.save(step)
            return
        with _ordered(self.manager, self.location(step), self.order):
            self.manager.save(step)

    def retention_order(self, order: str) -> bool:
        super().retention_order(order)
        self.order = order
        return True

    def wait(self) -> None:
        wait_for_saving(self.manager)

    def latest(self) -> int | None:
        step = self.manager._find_load_step()
        return None if step < 0 else int(step)

    def _loaded(self, template: dict[str, Any]) -> dict[str, Any]:
        return {key: self.states[key] for key in template}

    def load(self, step: int, template: dict[str, Any]) -> dict[str, Any]:
        self._use(copy.deepcopy(template))
        self.manager.load(step)
        return self._loaded(template)

    def resume(self, template: dict[str, Any]) -> tuple[int, dict[str, Any]] | None:
        step = self.latest()
        self._use(copy.deepcopy(template))
        if not self.manager.load(-1) or step is None:
            return None
        return step, self._loaded(template)

    def location(self, step: int) -> str:
        return os.path.join(self.root, f"step-{step}")

    def steps(self) -> list[int]:
        if not os.path.isdir(self.root):
            return []
        return sorted(int(m.group(1)) for m in map(re.compile(r"step-(\d+)$").match, os.listdir(self.root)) if m)

    def close(self) -> None:
        try:
            wait_for_saving(self.manager)
        finally:
            self.manager.close()  # joins the purge thread, even after a failed save (which wait re-raises)


@contextlib.contextmanager
def _ordered(manager: Any, location: str, order: str) -> Iterator[None]:
    """One save() of torchtitan's `manager` with its retention forced to list the `step-<N>` folders before
    ("retention-first") or after ("location-first") the save's writer created `location`, the new step's folder.

    The race, in torchtitan 0.3.0 and torch 2.13: `_save()` (torchtitan/components/checkpointer/dcp.py:446-456)
    hands the write to `dcp.async_save`, whose executor thread plans it and creates the folder
    (`FileSystemWriter.prepare_local_plan`, torch/distributed/checkpoint/filesystem.py:652); meanwhile the trainer's
    thread runs a garbage collection and then `_purge_stale_checkpoints()` (dcp.py:466), which lists the folders
    (dcp.py:829-837) and queues all but the newest k for deletion: the new folder counts only if it is already there.
    torchtitan 0.2.2 runs the same sequence in save() itself (components/checkpoint.py:530-543: dcp_save, a garbage
    collection, `_purge_stale_checkpoints()`, which lists the folders at 856).
    Forced by holding one side, nothing else changed: "retention-first" holds the writer's creation of `location`
    until the purge has listed; "location-first" holds the purge until `location` exists (or the save ended
    without it). Either hold gives up after _HOLD seconds."""
    from torch.distributed.checkpoint.filesystem import FileSystem

    listed = threading.Event()
    purge, mkdir = manager._purge_stale_checkpoints, FileSystem.mkdir
    target = os.path.abspath(location)

    def held_mkdir(fs: FileSystem, path: str | os.PathLike[Any]) -> None:
        if order == "retention-first" and os.path.abspath(path) == target:
            listed.wait(_HOLD)
        mkdir(fs, path)

    def ordered_purge() -> None:
        if order == "location-first":
            deadline = time.monotonic() + _HOLD
            future = manager.save_future
            while not os.path.isdir(target) and time.monotonic() < deadline:
                if future is not None and future.done():
                    break
                time.sleep(0.005)
        try:
            purge()
        finally:
            listed.set()

    manager._purge_stale_checkpoints = ordered_purge
    FileSystem.mkdir = held_mkdir  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        listed.set()
        FileSystem.mkdir = mkdir  # type: ignore[method-assign]
        del manager._purge_stale_checkpoints
