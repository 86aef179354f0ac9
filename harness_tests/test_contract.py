"""The adapter contract is checked at load, in one line naming what is wrong (issue 32), mypy checks every built-in
adapter against its types (ckptspec/spec/targets/_typed.py lists them all), and the documented entry-point route
(docs/adding-a-target.md) works end to end: a throw-away target, registered as an installed distribution's entry
point, runs one protocol test.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from ckptspec.spec.harness.surface import contract
from ckptspec.spec.harness.surface import loading as targets
from ckptspec.spec.harness.surface.saver_api import SAVER_OPTIONS, protocol_saver
from harness_tests.pytest_runs import REPO_ROOT, clean_env, run_pytest


def _adapter(**names: Any) -> types.ModuleType:
    module = types.ModuleType("fake_adapter")
    base: dict[str, Any] = {
        "NAME": "fake",
        "DISTRIBUTION": None,
        "MODULES": {},
        "CAPABILITIES": frozenset({"protocol"}),
        "EXPECTATIONS": None,
    }
    base["protocol_saver"] = lambda **options: None
    for key, value in {**base, **names}.items():
        if value is not _GONE:
            setattr(module, key, value)
    return module


_GONE = object()
BROKEN: dict[str, tuple[dict[str, Any], str]] = {
    "no NAME": ({"NAME": _GONE}, "defines no NAME (str)"),
    "DISTRIBUTION of a wrong type": ({"DISTRIBUTION": 3}, "DISTRIBUTION must be str | None, not int"),
    "unknown spec module": ({"MODULES": {"dcp": "torch.distributed.checkpoint"}}, "unknown spec module paths dcp"),
    "unknown capability": (
        {"CAPABILITIES": frozenset({"teleport"})},
        "declares unknown capabilities teleport",
    ),
    "missing expectations file": ({"EXPECTATIONS": "/no/such/file.toml"}, "EXPECTATIONS names /no/such/file.toml"),
    "protocol without a saver": ({"protocol_saver": _GONE}, "defines no protocol_saver(**options)"),
    "saver without **options": (
        {"protocol_saver": lambda persistent=None: None},
        "protocol_saver must accept **options",
    ),
    "saver without the capability": ({"CAPABILITIES": frozenset()}, 'does not declare capability "protocol"'),
    "PACKAGES of a wrong type": ({"PACKAGES": "torch"}, "PACKAGES must be tuple[str, ...], not str"),
    "NCCL_BACKEND of a wrong type": (
        {"NCCL_BACKEND": ("cpu", "gloo")},
        "NCCL_BACKEND must be str, not tuple holding str",
    ),
    "FORMAT without a loader": (
        {"FORMAT": object()},
        "FORMAT must be ckptspec.spec.harness.surface.formats.CheckpointFormat, not object",
    ),
    "manager without a factory": (
        {"CAPABILITIES": frozenset({"protocol", "manager"})},
        'declares capability "manager" but defines no checkpoint_manager(root, keep)',
    ),
    "factory without the capability": (
        {"checkpoint_manager": lambda root, keep: None},
        'defines checkpoint_manager but does not declare capability "manager"',
    ),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_adapter_is_one_line_naming_what_is_wrong(case):
    names, fragment = BROKEN[case]
    with pytest.raises(targets.TargetError) as info:
        targets._check_contract("fake", _adapter(**names))
    message = str(info.value)
    assert fragment in message, message
    assert "\n" not in message, message
    assert message.startswith("adapter fake_adapter of target 'fake' "), message


@pytest.mark.parametrize("member", contract.members(), ids=lambda member: member.name)
def test_every_name_of_the_contract_is_checked_at_load(member):
    """The check is derived from the Protocols: every name they state, given a wrong value, stops the load naming it;
    and every required one, left out, too (a function's capability declared)."""
    names: dict[str, Any] = {"CAPABILITIES": frozenset({"protocol", member.capability or "protocol"})}
    names[member.name] = 3.5 if member.signature is None else "not a function"
    with pytest.raises(targets.TargetError, match=rf"\b{member.name}\b"):
        targets._check_contract("fake", _adapter(**names))
    if member.required:
        names[member.name] = _GONE
        with pytest.raises(targets.TargetError, match=rf"defines no {re.escape(member.shown)} "):
            targets._check_contract("fake", _adapter(**names))


def test_a_function_must_take_what_the_contract_passes_and_require_nothing_else():
    manager = _adapter(CAPABILITIES=frozenset({"protocol", "manager"}), checkpoint_manager=lambda root: None)
    assert contract.problem(manager) == "checkpoint_manager must accept the parameter keep"
    needs_path = _adapter(install=lambda path: None)
    assert contract.problem(needs_path) == "install requires path, which the harness never passes"
    assert contract.problem(_adapter(install=lambda: None, checkpoint_manager=_GONE)) is None


def test_the_docs_table_is_the_contract():
    """docs/adding-a-target.md shows the table made from the Protocols (regenerate.py keeps it so; this says why)."""
    text = (REPO_ROOT / "docs" / "adding-a-target.md").read_text()
    assert contract.table() in text
    assert [m.name for m in contract.members()][:5] == [
        "NAME",
        "DISTRIBUTION",
        "MODULES",
        "CAPABILITIES",
        "EXPECTATIONS",
    ]


def test_every_builtin_adapter_keeps_the_contract_and_is_type_checked():
    typed = (REPO_ROOT / "ckptspec/spec" / "targets" / "_typed.py").read_text()
    listed = set(re.findall(r'^\s+"([a-z-]+)": [a-z_]+,$', typed, re.M))
    assert listed == set(targets.builtin_targets()), "ckptspec/spec/targets/_typed.py must list every built-in adapter"
    for dotted in targets.builtin_targets().values():
        module = __import__(dotted, fromlist=["NAME"])
        targets._check_contract(module.NAME, module)


# Each adapter of issue 63 (ckptspec/spec/targets/), and the function its copy loses: the copy's CAPABILITIES then
# name a capability whose function it lacks. Loaded by module name from a directory of its own, on a machine without
# the library: the contract is checked before the library is imported.
BROKEN_COPIES = {
    "deepspeed": "checkpoint_manager",
    "olmo_core": "protocol_saver",
    "transformers": "checkpoint_manager",
    "torch_checkpointing": "protocol_saver",
}
_SHOWN = {"checkpoint_manager": "checkpoint_manager(root, keep)", "protocol_saver": "protocol_saver(**options)"}


@pytest.mark.parametrize("module", BROKEN_COPIES)
def test_a_broken_copy_of_a_library_adapter_is_refused_at_load(module, tmp_path, monkeypatch):
    function = BROKEN_COPIES[module]
    source = (REPO_ROOT / "ckptspec" / "spec" / "targets" / f"{module}.py").read_text()
    assert source.count(f"\ndef {function}(") == 1, f"{module}.py no longer defines {function}"
    name = f"broken_{module}_copy"
    (tmp_path / f"{name}.py").write_text(source.replace(f"\ndef {function}(", f"\ndef _renamed_{function}("))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(targets, "_loaded", {})
    monkeypatch.delitem(sys.modules, name, raising=False)
    with pytest.raises(targets.TargetError) as info:
        targets.load_target(name)
    message = str(info.value)
    assert message.startswith(f"adapter {name} of target {name!r} declares capability "), message
    assert f"but defines no {_SHOWN[function]} (function)" in message, message
    assert "\n" not in message, message
    monkeypatch.delitem(sys.modules, name, raising=False)


def test_the_trainer_group_is_the_adapters_where_a_test_asks_for_nccl():
    """torch's async_save refuses an NCCL-only group, so the DCP adapters name one with a CPU backend; the others
    keep plain NCCL (NVRx's replication reads the backend's name), and gloo stays gloo for every target."""
    dcp, impl = targets.load_target("dcp-thread"), targets.load_target("impl")
    assert dcp.backend("nccl") == "cpu:gloo,cuda:nccl"
    assert impl.backend("nccl") == "nccl"
    assert dcp.backend("gloo") == impl.backend("gloo") == "gloo"


def test_an_unknown_saver_option_is_the_callers_mistake():
    with pytest.raises(ValueError, match="unknown saver options persist; known: persistent"):
        protocol_saver(persist=False)
    assert set(SAVER_OPTIONS) == {"persistent"}


_THROWAWAY = '''\
"""A throw-away target: torch's synchronous dcp.save behind the protocol layer."""
from typing import Any

from ckptspec.spec.harness.surface.saver_api import SaveHandle, Saver

NAME = "throwaway"
DISTRIBUTION = None
MODULES: dict[str, str] = {}
CAPABILITIES = frozenset({"protocol"})
EXPECTATIONS = None


class _Done(SaveHandle):
    def wait(self) -> None:
        return None


class _Sync(Saver):
    def start(self, state_dict: dict, path: str) -> SaveHandle:
        import torch.distributed.checkpoint as dcp

        dcp.save(state_dict, checkpoint_id=path)
        return _Done()

    def close(self) -> None:
        return None


def protocol_saver(**options: Any) -> Saver:
    return _Sync()
'''


def _install_throwaway(site: Path) -> None:
    """An installed distribution on `site` whose entry point of group ckptspec.targets names the adapter."""
    (site / "throwaway_adapter.py").write_text(_THROWAWAY)
    info = site / "throwaway_target-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: throwaway-target\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[{targets.ENTRY_POINT_GROUP}]\nthrowaway = throwaway_adapter\n")


def _run_on(site: Path, target: str, *tests: str) -> Any:
    """`tests` run against `target`, whose adapter lies in `site`; the run must succeed."""
    run = run_pytest(
        [*tests, "--impl", target, "-p", "no:randomly", "-q", "-rs"], env=clean_env(PYTHONPATH=f"{site}:{REPO_ROOT}")
    )
    assert run.code == 0, run.describe()
    return run


def test_a_target_added_through_an_entry_point_runs_a_protocol_test(tmp_path):
    """...and a test of an NVRx-shaped area, whose modules a route-2 adapter does not map, is not applicable to it:
    skipped, saying so (docs/adding-a-target.md), not an error."""
    _install_throwaway(tmp_path)
    test = "ckptspec/spec/protocol/test_snapshot.py::test_checkpoint_of_every_world_loads_with_stock_dcp[1]"
    run = _run_on(
        tmp_path, "throwaway", test, "ckptspec/spec/async_ckpt/test_request.py::test_fields_order_and_defaults"
    )
    assert "1 passed, 1 skipped" in run.output, run.describe()
    assert "not applicable: target 'throwaway' maps no NVRx module path" in run.output, run.describe()


_PARTIAL = '''\
"""A route-1 adapter that maps one spec module only: impl's local checkpointing base class."""
NAME = "partial"
DISTRIBUTION = None
MODULES = {"local.base_state_dict": "ckptspec.impl.local.base_state_dict"}
CAPABILITIES = frozenset({"persistent_caller"})
EXPECTATIONS = None
'''


def test_a_test_asking_for_a_module_the_adapter_does_not_map_is_not_applicable(tmp_path):
    """Asked for in a fixture (`core`) or inside a rank, a module the adapter does not map skips the test, saying
    which: not an error charged to the target (docs/adding-a-target.md)."""
    (tmp_path / "partial_adapter.py").write_text(_PARTIAL)
    in_fixture = "ckptspec/spec/async_ckpt/test_request.py::test_fields_order_and_defaults"
    in_rank = "ckptspec/spec/async_ckpt/test_queue.py::test_default_queue_is_persistent_and_counts_from_zero"
    run = _run_on(tmp_path, "partial_adapter", in_fixture, in_rank)
    assert "2 skipped" in run.output, run.describe()
    assert run.output.count("not applicable: target 'partial_adapter' has no module for 'async_ckpt.core'") == 2, (
        run.describe()
    )


def test_a_manager_without_a_retention_race_forces_no_order():
    """The manager contract's retention_order: False by default (nothing races, the tests judge one order), and an
    order outside RETENTION_ORDERS is refused rather than taken for one of them."""
    from ckptspec.spec.harness.surface.manager_api import RETENTION_ORDERS, CheckpointManager

    class _Plain(CheckpointManager):
        save = wait = latest = resume = load = location = steps = close = None  # type: ignore[assignment]

    _Plain.__abstractmethods__ = frozenset()
    manager = _Plain()
    assert [manager.retention_order(order) for order in RETENTION_ORDERS] == [False, False]
    with pytest.raises(ValueError, match="unknown retention order 'later'"):
        manager.retention_order("later")
