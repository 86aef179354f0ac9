"""What a save holds: the state dict as it was when start() returned (P-SNAP-*; at the weak level P-SNAP-1w, each
element as it was then or as the trainer changed it), or when staged() returned (P-STAGED-1; its weak level
P-STAGED-1w as P-SNAP-1w), read back with stock dcp.load without a process group (P-LOAD-1)."""

import uuid

import pytest
import torch
from hypothesis import given

from ckptspec.spec.drivers.protocol_saves import assert_loads, load, loader, start, wait, warm_saver
from ckptspec.spec.drivers.saving import mismatch
from ckptspec.spec.harness import strategies
from ckptspec.spec.harness.processes import remove
from ckptspec.spec.harness.ranks import devices, rank_state, ranks, world
from ckptspec.spec.harness.surface.loading import checkpoint_format

pytestmark = pytest.mark.needs("protocol")
DELAY_NUMEL = 1 << 21  # an 8 MiB tensor: the save is still in flight when the trainer changes the state


def _own(rank: int, state_dict: dict, device: str = "cpu") -> dict:
    """This rank's keys: a large tensor first, then the drawn state dict (in the trainer's private memory)."""
    mine = {"big": torch.arange(DELAY_NUMEL, dtype=torch.float32, device=device), **strategies.private_copy(state_dict)}
    return {f"r{rank}": mine}


def _save_then_change(path, state_dict, wait_staged=False, device=None):
    rank, world_size = world()
    mine = _own(rank, state_dict, device or devices.current())
    if "saver" not in rank_state:  # one saver per warm rank, kept across examples as a trainer keeps it
        rank_state["saver"] = warm_saver(path)
    handle = start(rank_state["saver"], mine, path)
    if wait_staged:
        handle.staged()
    # A training step, right after start() (or staged()) returned; the small drawn tensors first, while a copy
    # made in the background after the return (if any) is still busy with the large one.
    own = mine[f"r{rank}"]
    strategies.mutate_in_place({k: v for k, v in own.items() if k != "big"})
    strategies.mutate_in_place(own["big"])
    wait(handle)
    want: dict = {}
    for r in range(world_size):
        want.update(_own(r, state_dict))  # every rank draws the same state dict: rebuild the others' keys
    return mismatch(load(want, path), want, f"{loader()} of a save whose state changed after start() returned")


@pytest.mark.spec("P-SNAP-1")
@pytest.mark.tensor_device
@given(state_dict=strategies.dcp_state_dicts())
def test_checkpoint_holds_the_state_when_start_returned(rank_pool, tmp_path_factory, state_dict):
    path = str(tmp_path_factory.mktemp("snap") / uuid.uuid4().hex)
    problems = [p for p in rank_pool(2).run(_save_then_change, path, state_dict) if p]
    remove(path)
    assert not problems, problems[0]


def _elements_old_or_new(path, wait_staged=False):
    rank, world_size = world()
    mine = _own(rank, strategies.WEAK_STATE, devices.current())
    if "saver" not in rank_state:
        rank_state["saver"] = warm_saver(path)
    handle = start(rank_state["saver"], mine, path)
    if wait_staged:
        handle.staged()
    strategies.mutate_in_place(mine)  # the training step, right after start() (or staged()) returned
    wait(handle)
    old: dict = {}
    for r in range(world_size):
        old.update(_own(r, strategies.WEAK_STATE))
    return strategies.neither_old_nor_mutated(load(old, path), old)


@pytest.mark.spec("P-SNAP-1w")
@pytest.mark.tensor_device
def test_every_element_is_as_it_was_at_start_or_as_the_trainer_changed_it(rank_pool, tmp_path):
    problems = [
        p for rank_problems in rank_pool(2).run(_elements_old_or_new, str(tmp_path / "c")) for p in rank_problems
    ]
    assert not problems, f"{loader()} of a save whose tensors changed after start() returned: " + "; ".join(problems)


@pytest.mark.spec("P-STAGED-1")
@pytest.mark.tensor_device
def test_state_may_change_once_staged_returns(rank_pool, tmp_path):
    state = {"w": torch.ones(5), "n": 3}
    problems = [p for p in rank_pool(2).run(_save_then_change, str(tmp_path / "c"), state, True) if p]
    assert not problems, problems[0]


@pytest.mark.spec("P-STAGED-1w")
@pytest.mark.tensor_device
def test_every_element_is_as_it_was_at_start_or_as_changed_once_staged(rank_pool, tmp_path):
    problems = [
        p for rank_problems in rank_pool(2).run(_elements_old_or_new, str(tmp_path / "c"), True) for p in rank_problems
    ]
    assert not problems, f"{loader()} of a save whose tensors changed after staged() returned: " + "; ".join(problems)


@pytest.mark.spec("P-SNAP-2")
@pytest.mark.gpu
@ranks(1, timeout=120)
def test_checkpoint_holds_cuda_tensors_as_they_were_when_start_returned(tmp_path):
    try:
        problem = _save_then_change(str(tmp_path / "c"), {"w": torch.ones(1 << 20)}, device="cuda")
    finally:
        saver = rank_state.pop("saver", None)  # absent when the first start() failed: keep that error in view
        if saver is not None:
            saver.close()
    assert problem is None, problem


def _every_rank_saves(path):
    rank, _world_size = world()
    mine = {f"r{rank}": {"w": torch.arange(6.0) + rank, "step": rank, "name": f"rank{rank}"}}
    saver = warm_saver(path)
    try:
        wait(start(saver, mine, path))
    finally:
        saver.close()


@pytest.mark.spec("P-LOAD-1")
@pytest.mark.parametrize("world_size", [1, 3])
def test_checkpoint_of_every_world_loads_with_stock_dcp(rank_pool, tmp_path, world_size):
    fmt = checkpoint_format()
    if not fmt.dcp:
        pytest.skip(f"P-LOAD-1 is about torch DCP's format; this target writes its own ({fmt.name})")
    path = str(tmp_path / "c")
    rank_pool(world_size).run(_every_rank_saves, path)
    want = {f"r{r}": {"w": torch.arange(6.0) + r, "step": r, "name": f"rank{r}"} for r in range(world_size)}
    assert_loads(path, want)
