"""TensorAwareStateDict laws, BasicTensorAwareStateDict's requirements, and the suite's CPU implementation.

BasicTensorAwareStateDict needs CUDA tensors (001). Without a GPU its tensor behaviour is specified
through what it refuses (TSD-6), what it does not look into (TSD-5) and state dicts without tensors;
the GPU tests cover the rest where a GPU exists.
"""

import copy
import re
import types

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ckptspec.spec.drivers.cpu_state_dict import CpuTensorAwareStateDict
from ckptspec.spec.harness import strategies
from ckptspec.spec.harness.asserts import assert_state_dict_equal

pytestmark = pytest.mark.needs("local_checkpointing")

INTERFACE = {
    "pop_tensors",
    "tensors",
    "is_hollow",
    "insert_tensors",
    "init_tensors",
    "copy_tensors_to_cpu",
    "restore_tensor_device",
}


def _basic(target):
    return target.module("local.basic_state_dict").BasicTensorAwareStateDict


@pytest.mark.spec("TSD-1")
def test_the_interface_is_abstract_until_every_method_is_implemented(target):
    base = target.module("local.base_state_dict").TensorAwareStateDict
    assert set(base.__abstractmethods__) == INTERFACE, f"abstract members: {sorted(base.__abstractmethods__)}"
    for missing in sorted(INTERFACE):
        partial = type("Partial", (base,), dict.fromkeys(INTERFACE - {missing}))
        with pytest.raises(TypeError):
            partial()
    assert issubclass(_basic(target), base)
    assert issubclass(CpuTensorAwareStateDict, base)


def _refused(call) -> bool:
    try:
        call()
    except Exception:
        return True
    return False


def _check_laws(make, state_dict):
    expected = copy.deepcopy(state_dict)
    tasd = make(state_dict)
    count = len(list(tasd.tensors))
    popped = tasd.pop_tensors()
    assert tasd.is_hollow, f"after pop_tensors: hollow={tasd.is_hollow}, {len(popped)} of {count} tensors returned"
    assert len(popped) == count, (
        f"after pop_tensors: hollow={tasd.is_hollow}, {len(popped)} of {count} tensors returned"
    )
    assert _refused(tasd.pop_tensors), "a hollow object gave tensors [TSD-3]"
    assert _refused(lambda: list(tasd.tensors)), "a hollow object gave tensors [TSD-3]"
    tasd.insert_tensors(popped)
    assert not tasd.is_hollow, "still hollow after insert_tensors"
    assert_state_dict_equal(tasd.state_dict, expected, call="insert_tensors(pop_tensors())")
    assert _refused(lambda: tasd.insert_tensors(popped)), (
        "insert_tensors/init_tensors on an object that is not hollow were accepted [TSD-3]"
    )
    assert _refused(tasd.init_tensors), (
        "insert_tensors/init_tensors on an object that is not hollow were accepted [TSD-3]"
    )
    tasd.pop_tensors()
    tasd.init_tensors()
    fresh = list(tasd.tensors)
    assert [(t.shape, t.dtype, t.device) for t in fresh] == [(t.shape, t.dtype, t.device) for t in popped], (
        "init_tensors made tensors of other shapes, dtypes or devices [TSD-4]"
    )


@pytest.mark.spec("TSD-2", "TSD-3", "TSD-4")
@given(state_dict=strategies.state_dicts())
def test_the_suites_cpu_state_dict_keeps_the_laws(state_dict):
    """The manager tests rely on this implementation; it must obey the interface's laws itself."""
    _check_laws(CpuTensorAwareStateDict, strategies.private_copy(state_dict))


@pytest.mark.spec("TSD-2", "TSD-3", "TSD-7")
@given(state_dict=strategies.state_dicts(with_tensors=False))
def test_basic_keeps_non_tensor_values_through_every_operation(target, state_dict):
    _check_laws(_basic(target), copy.deepcopy(state_dict))
    tasd = _basic(target)(copy.deepcopy(state_dict))
    tasd.copy_tensors_to_cpu()
    tasd.restore_tensor_device(non_blocking=False)
    assert_state_dict_equal(tasd.state_dict, state_dict, call="copy_tensors_to_cpu(); restore_tensor_device()")


@pytest.mark.spec("TSD-5")
def test_basic_does_not_look_into_tuples_or_objects(target):
    hidden = torch.arange(3)  # a CPU tensor: Basic would refuse it anywhere it looks
    state_dict = {"pair": (hidden, 1), "obj": types.SimpleNamespace(t=hidden), "nested": [{"t": (hidden,)}]}
    tasd = _basic(target)(state_dict)
    assert tasd.pop_tensors() == [], "tensors inside tuples were popped"
    tasd.insert_tensors([])
    kept = [tasd.state_dict["pair"][0], tasd.state_dict["obj"].t, tasd.state_dict["nested"][0]["t"][0]]
    assert all(t is hidden for t in kept), "values holding tensors outside dicts and lists were changed"


def _tensor_keys(state_dict) -> list:
    def has_tensor(value):
        if isinstance(value, torch.Tensor):
            return True
        items = value.values() if isinstance(value, dict) else value if isinstance(value, list) else []
        return any(has_tensor(v) for v in items)

    return [key for key, value in state_dict.items() if has_tensor(value)]


@pytest.mark.spec("TSD-6")
@given(state_dict=strategies.state_dicts())
def test_basic_refuses_cpu_tensors_naming_the_entry(target, state_dict):
    keys = _tensor_keys(state_dict)
    if not keys:
        _basic(target)(state_dict)  # nothing to refuse
        return
    # The error names one of the entries holding CPU tensors.
    with pytest.raises(ValueError, match="|".join(re.escape(repr(key)) for key in keys)):
        _basic(target)(state_dict)


@pytest.mark.gpu
@pytest.mark.spec("TSD-2", "TSD-3", "TSD-4", "TSD-7")
@given(state_dict=strategies.state_dicts(device="cuda"), data=st.data())
def test_basic_on_cuda_keeps_the_laws_and_moves_between_devices(target, state_dict, data):
    _check_laws(_basic(target), copy.deepcopy(state_dict))
    tasd = _basic(target)(copy.deepcopy(state_dict))
    tasd.copy_tensors_to_cpu(non_blocking=data.draw(st.booleans(), label="non_blocking"))
    torch.cuda.synchronize()
    assert all(t.device.type == "cpu" for t in tasd.tensors), "copy_tensors_to_cpu left tensors on the GPU"
    assert_state_dict_equal(tasd.state_dict, state_dict, call="copy_tensors_to_cpu()")
    tasd.restore_tensor_device(non_blocking=False)
    assert all(t.is_cuda for t in tasd.tensors), "restore_tensor_device left tensors on the CPU"
    assert_state_dict_equal(tasd.state_dict, state_dict, call="restore_tensor_device()")
