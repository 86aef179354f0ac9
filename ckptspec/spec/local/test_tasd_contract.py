"""What LocalCheckpointManager may require of a TensorAwareStateDict (LM-17).

Without replication a TASD that implements only the device moves (copy_tensors_to_cpu, restore_tensor_device)
saves and loads back exactly; with replication such a TASD is refused at save() on every rank, with the missing
method named, and nothing is written.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import pytest
import torch

from ckptspec.spec.drivers.cpu_state_dict import TargetsTensorAwareStateDict
from ckptspec.spec.drivers.local import (
    BOUND,
    Found,
    assert_found,
    find_then_load,
    manager,
    module,
    node_root,
    rank_value,
    save,
    tasd,
)
from ckptspec.spec.harness.asserts import assert_each_rank, attempt
from ckptspec.spec.harness.ranks import world

pytestmark = pytest.mark.needs("local_checkpointing")

UNUSED = ("pop_tensors", "tensors", "is_hollow", "insert_tensors", "init_tensors")


class DeviceMovesOnly(TargetsTensorAwareStateDict):
    """A TASD over a nested dict of CPU tensors that implements only the device moves."""

    def __init__(self, state_dict: dict):
        self.state_dict = state_dict

    def copy_tensors_to_cpu(self, non_blocking=False):
        self.state_dict = _map(lambda t: t.detach().to("cpu", copy=True), self.state_dict)

    def restore_tensor_device(self, non_blocking=True):
        pass  # CPU tensors: nothing to move

    # What a user who needs only the device moves writes for the rest of the interface.
    def pop_tensors(self):
        raise NotImplementedError

    @property
    def tensors(self):
        raise NotImplementedError

    @property
    def is_hollow(self):
        raise NotImplementedError

    def insert_tensors(self, tensor_data):
        raise NotImplementedError

    def init_tensors(self):
        raise NotImplementedError


torch.serialization.add_safe_globals([DeviceMovesOnly])  # parts may load with weights_only=True (IN-4)


def _map(fn, obj):
    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: _map(fn, v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_map(fn, v) for v in obj]
    return obj


def _save_device_moves_only(base, mode):
    rank, _ = world()
    state = DeviceMovesOnly(_map(torch.clone, rank_value(rank, 3)))
    save(manager(base), state, 3, mode)
    return find_then_load(manager(base))


@pytest.mark.spec("LM-17", "LM-2")
@pytest.mark.parametrize(
    "mode",
    ["sync", pytest.param("temporal", marks=pytest.mark.needs("temporal_caller"))],
)
def test_without_replication_the_device_moves_are_enough(rank_pool, tmp_path, mode):
    results = rank_pool(2).run(_save_device_moves_only, str(tmp_path), mode)
    assert_found(results, 3, [rank_value(r, 3) for r in range(2)], f"save({mode}) of a TASD with only device moves")


@dataclass(frozen=True)
class Refused:
    save: str  # "returned", or the class name of what save() raised
    names_a_missing_method: bool
    storage_unchanged: bool
    then: Found


def _listing(base):
    root = node_root(base, world()[0])
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


def _save_with_replication(base, layout):
    rank, _ = world()
    save(manager(base, layout), tasd(rank_value(rank, 1)), 1)
    before = _listing(base)
    errors = (module("ckpt_managers.base_manager").CheckpointingException,)
    outcome = attempt(
        manager(base, layout).save,
        DeviceMovesOnly(rank_value(rank, 2)),
        2,
        bound=BOUND,
        what="save(2) with replication",
        named=errors,
        hung_fails=True,
    )
    named = any(name in outcome.message for name in UNUSED)
    return Refused(outcome.text, named, before == _listing(base), find_then_load(manager(base, layout)))


@pytest.mark.spec("LM-17")
def test_with_replication_a_missing_method_is_refused_at_save(rank_pool, tmp_path):
    results = rank_pool(2).run(_save_with_replication, str(tmp_path), (1, 2))
    assert_each_rank(
        "save",
        [(r.save, r.names_a_missing_method, r.storage_unchanged) for r in results],
        ("CheckpointingException", True, True),
        call="save(2) with replication (1, 2) of a TASD implementing only copy_tensors_to_cpu and "
        "restore_tensor_device: a clear error naming the missing method, nothing written",
    )
    assert_found([r.then for r in results], 1, [rank_value(r, 1) for r in range(2)], "the refused save(2)")
