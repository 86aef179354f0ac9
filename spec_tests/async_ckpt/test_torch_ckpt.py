"""TorchAsyncCheckpoint: torch.save in the background, finalized in a training loop."""

import os
from typing import Any

import pytest
import torch

from spec_tests.async_ckpt.pickle_probe import PidOnPickle, pickled_by
from spec_tests.harness import devices, strategies, workloads
from spec_tests.harness.asserts import assert_equal, assert_state_dict_equal, bounded
from spec_tests.harness.processes import CALLERS, remove
from spec_tests.harness.targets import current_target
from spec_tests.harness.warm_savers import examples_on_warm_ranks, kept

pytestmark = pytest.mark.needs("torch_async_checkpoint")


def _checkpointer(persistent):
    return current_target().module("async_ckpt.torch_ckpt").TorchAsyncCheckpoint(persistent_queue=persistent)


def _save_mutate_load(tmp, persistent, state_dict):
    gate, path = os.path.join(tmp, "gate"), os.path.join(tmp, "ckpt.pt")
    # The write waits at the gate; the tensors live where the run's trainer keeps them (--tensor-device).
    state_dict = {"0gate": workloads.PickleGate(gate), **strategies.private_copy(state_dict, devices.current())}
    expected = strategies.private_copy(state_dict)
    ckpt = kept(("TAC-1", persistent), lambda: _checkpointer(persistent))
    ckpt.async_save(state_dict, path)
    strategies.mutate_in_place(state_dict)
    workloads.open_gate(gate)
    bounded(60, "finalize_async_save(blocking=True)", ckpt.finalize_async_save, True)
    assert_state_dict_equal(
        torch.load(path, weights_only=False),
        expected,
        call="torch.load of a file written by async_save before an in-place update",
    )
    remove(gate, path)


def _terminate(ckpt):
    bounded(60, "finalize_async_save(terminate=True)", ckpt.finalize_async_save, True, True, True)


@pytest.mark.spec("TAC-1", "AQ-14")
@pytest.mark.tensor_device
@pytest.mark.parametrize("persistent", CALLERS)
def test_async_save_writes_the_state_as_it_was(rank_pool, tmp_path_factory, persistent):
    examples_on_warm_ranks(  # one checkpointer for every example (warm_savers.kept), terminated at the end
        rank_pool(1),
        strategies.state_dicts(),
        _save_mutate_load,
        _terminate,
        lambda state_dict: (str(tmp_path_factory.mktemp("tac")), persistent, state_dict),
    )


def _training_loop(tmp, persistent):
    ckpt = _checkpointer(persistent)
    model: dict[str, Any] = {"w": torch.zeros(8, device=devices.current()), "step": 0}
    saved = {}
    for step in range(6):
        gate = os.path.join(tmp, f"gate{step}")
        # Must return at once although the previous save is still held by its gate.
        bounded(10, "finalize_async_save(blocking=False) while a save is in flight", ckpt.finalize_async_save, False)
        model["w"].add_(1)
        model["step"] = step
        if step % 2 == 0:
            path = os.path.join(tmp, f"step{step}.pt")
            ckpt.async_save({"0gate": workloads.PickleGate(gate), **model}, path)
            saved[path] = {"w": model["w"].clone(), "step": step}
        if step >= 1:
            workloads.open_gate(os.path.join(tmp, f"gate{step - 1}"))
    workloads.open_gate(os.path.join(tmp, "gate5"))
    bounded(60, "finalize_async_save(blocking=True, terminate=True)", ckpt.finalize_async_save, True, True, True)
    for path, expected in saved.items():
        loaded = torch.load(path, weights_only=False)
        assert_state_dict_equal({"w": loaded["w"], "step": loaded["step"]}, expected, call=f"torch.load({path})")
    return len(saved)


@pytest.mark.spec("TAC-2")
@pytest.mark.tensor_device
@pytest.mark.parametrize("persistent", CALLERS)
def test_non_blocking_finalize_in_a_training_loop(rank_pool, tmp_path, persistent):
    assert_equal(
        "checkpoints saved and checked",
        rank_pool(1).run(_training_loop, str(tmp_path), persistent)[0],
        3,
        call="six steps, async_save every second one, finalize_async_save(blocking=False) every step",
    )


def _two_instances(tmp):
    persistent, temporal = _checkpointer(True), _checkpointer(False)
    a, b = {"x": torch.arange(4)}, {"y": torch.ones(3)}
    persistent.async_save(a, os.path.join(tmp, "a.pt"))
    temporal.async_save(b, os.path.join(tmp, "b.pt"))
    bounded(60, "finalize_async_save on the persistent instance", persistent.finalize_async_save, True, True, True)
    bounded(60, "finalize_async_save on the temporal instance", temporal.finalize_async_save, True, True, True)
    assert_state_dict_equal(torch.load(os.path.join(tmp, "a.pt")), a, call="persistent instance's file")
    assert_state_dict_equal(torch.load(os.path.join(tmp, "b.pt")), b, call="temporal instance's file")


@pytest.mark.spec("TAC-3")
def test_instances_do_not_interfere(rank_pool, tmp_path):
    rank_pool(1).run(_two_instances, str(tmp_path))


def _writer_processes(tmp, persistent):
    """Two saves; for each, the processes other than the trainer that serialized it."""
    ckpt = _checkpointer(persistent)
    writers = []
    for i in range(2):
        probe = os.path.join(tmp, f"probe{i}")
        ckpt.async_save({"probe": PidOnPickle(probe), "w": torch.ones(2)}, os.path.join(tmp, f"ckpt{i}.pt"))
        bounded(60, "finalize_async_save(blocking=True)", ckpt.finalize_async_save, True)
        writers.append(sorted(set(pickled_by(probe)) - {os.getpid()}))
    bounded(60, "finalize_async_save(terminate=True)", ckpt.finalize_async_save, True, True, True)
    return writers


@pytest.mark.spec("TAC-4")
@pytest.mark.parametrize("persistent", CALLERS)
def test_persistent_queue_chooses_the_caller(rank_pool, tmp_path, persistent):
    first, second = rank_pool(1).run(_writer_processes, str(tmp_path), persistent)[0]
    assert len(first) == 1, f"each save serialized in one background process: {first}, {second}"
    assert len(second) == 1, f"each save serialized in one background process: {first}, {second}"
    assert_equal(
        f"TorchAsyncCheckpoint(persistent_queue={persistent}): both saves serialized in the same process",
        first == second,
        persistent,
    )
