"""IN-6: a program's own TensorAwareStateDict subclass, never allowlisted, saves and loads through the manager on
every rank (sync, async, replicated); a state dict whose parts could not be loaded back is refused at save().

`UserStateDict` is written as a user of the NVRx guide (001) writes one: a module-level subclass of the target's
TensorAwareStateDict holding tensors and plain values. Unlike the suite's CpuTensorAwareStateDict, it is never
passed to torch.serialization.add_safe_globals.
"""

from __future__ import annotations

import pytest
import torch

from ckptspec.spec.drivers.cpu_state_dict import TargetsTensorAwareStateDict
from ckptspec.spec.drivers.local import BOUND, manager, save
from ckptspec.spec.harness.asserts import assert_each_rank, attempt, bounded
from ckptspec.spec.harness.ranks import world

pytestmark = pytest.mark.needs("local_checkpointing")

LAYOUTS = [pytest.param(None, id="no-replication"), pytest.param((1, 2), id="jump1-factor2")]
MODES = ["sync", "temporal", "persistent"]


class UserStateDict(TargetsTensorAwareStateDict):
    """Named tensors and plain values; a popped tensor leaves a (shape, dtype) tuple behind."""

    def __init__(self, values: dict):
        self.values_by_name = values
        self.hollow = False

    @property
    def is_hollow(self) -> bool:
        return self.hollow

    @property
    def tensors(self):
        return [v for v in self.values_by_name.values() if isinstance(v, torch.Tensor)]

    def pop_tensors(self):
        popped = self.tensors
        for key, value in self.values_by_name.items():
            if isinstance(value, torch.Tensor):
                self.values_by_name[key] = (tuple(value.shape), value.dtype)
        self.hollow = True
        return popped

    def _slots(self) -> list[str]:
        return [k for k, v in self.values_by_name.items() if isinstance(v, tuple)]

    def insert_tensors(self, tensor_data):
        for key, tensor in zip(self._slots(), list(tensor_data), strict=True):
            self.values_by_name[key] = tensor
        self.hollow = False

    def init_tensors(self):
        slots = [self.values_by_name[k] for k in self._slots()]
        self.insert_tensors([torch.empty(shape, dtype=dtype) for shape, dtype in slots])

    def copy_tensors_to_cpu(self, non_blocking=False):
        for key, value in self.values_by_name.items():
            if isinstance(value, torch.Tensor):
                self.values_by_name[key] = value.detach().to("cpu", copy=True)

    def restore_tensor_device(self, non_blocking=True):
        pass


class Opaque:
    """A value of a class no one allowed: a part holding it cannot load under weights_only."""

    def __init__(self, n: int):
        self.n = n


def _values(rank: int) -> dict:
    return {"weight": torch.arange(6, dtype=torch.float32) + rank, "step": 10 + rank, "name": f"rank{rank}"}


def save_then_load(base: str, layout, mode: str):
    """On every rank: save its own UserStateDict, then find and load with a new manager; what load() gave."""
    rank, _ = world()
    save(manager(base, layout), UserStateDict(_values(rank)), 1, mode)
    fresh = manager(base, layout)
    latest = bounded(BOUND, "find_latest()", fresh.find_latest)
    loaded = attempt(fresh.load, bound=BOUND, what="load()", hung_fails=True)
    if not loaded.returned:
        return latest, f"{loaded.text}: {loaded.message}"
    state, _ = loaded.value
    same = type(state) is UserStateDict and _equal(state.values_by_name, _values(rank))
    return latest, "returned" if same else f"returned {type(state).__name__} {getattr(state, 'values_by_name', None)}"


def _equal(got: dict, want: dict) -> bool:
    if got.keys() != want.keys():
        return False
    return all(
        torch.equal(g, w) if isinstance(w, torch.Tensor) else g == w
        for g, w in zip(got.values(), want.values(), strict=True)
    )


@pytest.mark.spec("IN-6", "IN-4", "LM-3")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode", MODES)
def test_a_programs_own_state_dict_class_saves_and_loads(rank_pool, tmp_path, layout, mode):
    results = rank_pool(2).run(save_then_load, str(tmp_path), layout, mode)
    assert_each_rank("(find_latest, load)", results, (1, "returned"), call=f"UserStateDict saved ({mode}) and loaded")


def _local_class_state():
    class LocalStateDict(UserStateDict):
        """Defined inside a function: pickle cannot name it, so no program can ever load it."""

    return LocalStateDict(_values(0))


def _opaque_value_state():
    return UserStateDict({**_values(0), "extra": Opaque(3)})


CANNOT_LOAD = {
    "local-class": (_local_class_state, "LocalStateDict"),
    "unallowed-value": (_opaque_value_state, "Opaque"),
}


def save_refused(base: str, case: str, mode: str):
    """On every rank: save a state dict that could not load back; (what save() raised, whether its message names
    the class, what find_latest() gives afterwards)."""
    make, named = CANNOT_LOAD[case]
    mgr = manager(base, None)
    outcome = attempt(save, mgr, make(), 1, mode, hung_fails=True)
    return outcome.text, named in outcome.message, bounded(BOUND, "find_latest()", manager(base, None).find_latest)


@pytest.mark.spec("IN-6")
@pytest.mark.parametrize("mode", ["sync", "persistent"])
@pytest.mark.parametrize("case", sorted(CANNOT_LOAD))
def test_a_state_dict_that_cannot_load_is_refused_at_save(rank_pool, tmp_path, case, mode):
    results = rank_pool(2).run(save_refused, str(tmp_path), case, mode)
    assert_each_rank(
        "(save() raised, names the class, find_latest())",
        results,
        ("CheckpointingException", True, -1),
        call=f"save ({mode}) of a state dict holding {CANNOT_LOAD[case][1]}, which could never be loaded",
    )


def save_judged(base: str, case: str, mode: str):
    """On every rank: save a state dict that could not load back, then look with a new manager; (what save()
    did, what find_latest() gives, what load() of it did or "not tried"). A save past the bound fails the rank."""
    make, _ = CANNOT_LOAD[case]
    saved = attempt(save, manager(base, None), make(), 1, mode, hung_fails=True).text
    fresh = manager(base, None)
    latest = bounded(BOUND, "find_latest()", fresh.find_latest)
    loaded = "not tried" if latest == -1 else attempt(fresh.load, bound=BOUND, what="load()", hung_fails=True).text
    return saved, latest, loaded


@pytest.mark.spec("IN-6w")
@pytest.mark.parametrize("mode", ["sync", "persistent"])
@pytest.mark.parametrize("case", sorted(CANNOT_LOAD))
def test_a_state_dict_that_cannot_load_never_hangs_nor_commits_what_does_not_load(rank_pool, tmp_path, case, mode):
    results = rank_pool(2).run(save_judged, str(tmp_path), case, mode)
    what = f"save ({mode}) of a state dict holding {CANNOT_LOAD[case][1]}: (save(), find_latest(), load()) per rank"
    if all(saved == "returned" for saved, _, _ in results):
        assert all(latest == 1 for _, latest, _ in results), f"{what} {results}, but a save that returned is found"
    assert all(latest == -1 or loaded == "returned" for _, latest, loaded in results), (
        f"{what} {results}, but an iteration that find_latest() reports should load on every rank"
    )
