"""torchtitan's `CheckpointManager` (torchtitan 0.3.0, `torchtitan/components/checkpointer/dcp.py`) behind the
protocol layer: `TitanSaver(mode)` for either async mode; the adapter `torchtitan` uses async_mode "async". Written
against the documented adapter contract (spec_tests.harness.contract), as an outside author would.

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
- wait(): `maybe_wait_for_saving()`.
- abort(): none (the default raises NotImplementedError); torchtitan documents no way to stop a save.
- close(): `close()` ("Release background threads and other resources.").

The one change to the library: a checkpoint goes to the directory the test names instead of `<folder>/step-<N>`
(`_create_checkpoint_id` returns it), so faults placed there reach it; the format is DCP's. Retention
(`keep_latest_k`) therefore never sees a `step-<N>` directory: the protocol layer does not judge it.
"""

from __future__ import annotations

from typing import Any

from spec_tests.harness.protocol import SaveHandle, Saver

DISTRIBUTION = "torchtitan"
INSTALL = 'pip install "torch==2.13.0" -e ".[test,torchtitan]"'
MODULES: dict[str, str] = {}
PACKAGES = ("torchtitan",)
CAPABILITIES = frozenset({"protocol"})


class _Counter:
    """A Stateful stand-in (an optimizer or LR scheduler container): one step counter."""

    def __init__(self) -> None:
        self.steps = 0

    def state_dict(self) -> dict[str, Any]:
        return {"steps": self.steps}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.steps = state_dict["steps"]


class _Handle(SaveHandle):
    def __init__(self, saver: TitanSaver, step: int):
        self.saver, self.step = saver, step

    def staged(self) -> None:
        if self.saver.step == self.step:  # an earlier save was waited for when the next one started
            self.saver.manager.maybe_wait_for_staging()

    def wait(self) -> None:
        if self.saver.step == self.step:
            self.saver.manager.maybe_wait_for_saving()


class TitanSaver(Saver):
    """One CheckpointManager with async_mode `mode`, kept across saves as the trainer keeps it."""

    def __init__(self, mode: str):
        import torch
        from torchtitan.components.checkpointer.dcp import CheckpointManager

        class _AtPath(CheckpointManager):
            target = ""

            def _create_checkpoint_id(self, step: int, folder: str = "") -> str:
                return self.target

        self.states: dict[str, Any] = {}
        self.components = set()
        config = CheckpointManager.Config(enable=True, folder="unused", interval=1, async_mode=mode)
        self.manager = _AtPath(
            config,
            dataloader=None,
            model_parts=[torch.nn.Linear(2, 2)],
            optimizers=_Counter(),
            lr_schedulers=_Counter(),
            states=self.states,
            sd_adapter=None,
        )
        self.components = set(self.states)  # model, optimizer, dataloader, lr_scheduler
        self.step = 0

    def start(self, state_dict: dict, path: str) -> SaveHandle:
        for key in set(self.states) - self.components:
            del self.states[key]
        self.states.update(state_dict)
        self.step += 1
        self.manager.target = path
        self.manager.save(self.step)
        return _Handle(self, self.step)

    def close(self) -> None:
        self.manager.close()
