"""Names and parameters documented for the async core, at their documented module paths (API-1); every public name
of NVRx's releases in a target that mirrors NVRx, or listed as left out (API-2)."""

import importlib
import importlib.util
import inspect
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from spec_tests.harness.targets import MissingCapability
from spec_tests.public_names import declared_attributes

# module -> class -> method -> documented parameters (name, default); inspect.Parameter.empty = required
EMPTY = inspect.Parameter.empty
MANIFEST: dict[str, dict[str, dict[str, list[tuple[str, Any]]]]] = {
    "async_ckpt.core": {
        "AsyncCaller": {
            "schedule_async_call": [("async_req", EMPTY)],
            "is_current_async_call_done": [("blocking", None), ("no_dist", None)],
            "sync_all_async_calls": [("is_alive", EMPTY)],
            "close": [("abort", False)],
        },
        "TemporalAsyncCaller": {
            "schedule_async_call": [("async_req", EMPTY)],
            "is_current_async_call_done": [("blocking", False), ("no_dist", False)],
            "close": [("abort", False)],
        },
        "PersistentAsyncCaller": {
            "schedule_async_call": [("async_req", EMPTY)],
            "is_current_async_call_done": [("blocking", False), ("no_dist", False)],
            "close": [("abort", False)],
        },
        "AsyncCallsQueue": {
            "__init__": [("persistent", None)],
            "schedule_async_request": [("async_request", EMPTY)],
            "maybe_finalize_async_calls": [("blocking", False), ("no_dist", False)],
            "get_num_unfinalized_calls": [],
            "close": [("abort", False)],
        },
        "AsyncRequest": {"add_finalize_fn": [("fn", EMPTY)], "execute_sync": [], "freeze": []},
    },
    "async_ckpt.torch_ckpt": {
        "TorchAsyncCheckpoint": {
            "__init__": [("persistent_queue", True)],
            "async_save": [("state_dict", EMPTY)],
            "finalize_async_save": [("blocking", False), ("no_dist", True), ("terminate", False)],
        },
    },
}
CASES = [
    pytest.param(mod, cls, meth, params, id=f"{mod}.{cls}.{meth}")
    for mod, classes in MANIFEST.items()
    for cls, methods in classes.items()
    for meth, params in methods.items()
]


@pytest.mark.spec("API-1")
@pytest.mark.parametrize(("module", "cls", "method", "params"), CASES)
def test_documented_method_exists_with_its_parameters(target, module, cls, method, params):
    try:
        mod = target.module(module)
    except MissingCapability as exc:
        pytest.skip(str(exc))
    assert hasattr(mod, cls), f"{mod.__name__} has no {cls}"
    fn = getattr(getattr(mod, cls), method, None)
    assert callable(fn), f"{cls}.{method} is missing"
    sig = inspect.signature(fn)
    for name, default in params:
        assert name in sig.parameters, f"{cls}.{method}{sig} has no parameter {name!r}"
        actual = sig.parameters[name].default
        if default is not None:
            assert actual == default, f"{cls}.{method}: {name}={actual!r}, but should default to {default!r}"


# release -> module path below nvidia_resiliency_ext.checkpointing -> {"": module names, class: its attributes}
NVRX_NAMES: dict[str, dict[str, dict[str, list[str]]]] = tomllib.loads(
    Path(__file__).with_name("nvrx_public_names.toml").read_text()
)
WHOLE_MODULE = "(module)"


def _mirror(target) -> tuple[str, dict[tuple[str, str], str]]:
    """The target's package that mirrors NVRx, and its left-out table: (module, name) -> the reason."""
    package, page = getattr(target.adapter, "NVRX_MIRROR", None), getattr(target.adapter, "NVRX_LEFT_OUT", None)
    if package is None or page is None:
        pytest.skip(f"target {target.name!r} does not mirror NVRx's modules (no NVRX_MIRROR in its adapter)")
    text = Path(page).read_text()
    table = text.split("<!-- left-out:start -->")[1].split("<!-- left-out:end -->")[0]
    left_out = {}
    for row in table.strip().splitlines()[2:]:
        module, names, _, why = (cell.strip() for cell in row.strip().strip("|").split("|"))
        for name in re.findall(r"`([^`]+)`", names):
            left_out[(module.strip("`"), name)] = why
    return package, left_out


def _has(mod, name: str) -> bool:
    """Whether module `mod` has `name` ("Class.attr": the class has the attribute, or declares it in its source)."""
    owner, _, attr = name.rpartition(".")
    if not owner:
        return hasattr(mod, name)
    cls = getattr(mod, owner, None)
    return isinstance(cls, type) and (hasattr(cls, attr) or attr in declared_attributes(cls))


def _present(package: str, module: str, name: str) -> bool:
    if name == WHOLE_MODULE:
        return importlib.util.find_spec(f"{package}.{module}") is not None
    return _has(importlib.import_module(f"{package}.{module}"), name)


def _names(modules: dict[str, list[str]]) -> list[str]:
    """A manifest module's names: module-level ones as they are, class attributes as "Class.attr"."""
    return [n if key == "" else f"{key}.{n}" for key, names in modules.items() for n in names]


@pytest.mark.spec("API-2")
@pytest.mark.parametrize(
    ("release", "module"), [pytest.param(r, m, id=f"{r}:{m or '.'}") for r, mods in NVRX_NAMES.items() for m in mods]
)
def test_every_public_name_of_nvrx_is_there_or_left_out(target, release, module):
    package, left_out = _mirror(target)
    if (module, WHOLE_MODULE) in left_out:
        return
    mod = importlib.import_module(f"{package}.{module}" if module else package)
    absent = [
        n
        for n in _names(NVRX_NAMES[release][module])
        if not _has(mod, n) and (module, n) not in left_out and (module, n.partition(".")[0]) not in left_out
    ]  # a class left out leaves out its attributes
    assert not absent, (
        f"{mod.__name__} lacks NVRx {release}'s public names {absent}: add them with NVRx's meaning, or list them "
        "in docs/impl.md's left-out table with the reason"
    )


@pytest.mark.spec("API-2")
def test_every_name_left_out_is_an_nvrx_name_the_target_lacks(target):
    package, left_out = _mirror(target)
    known = {(m, n) for mods in NVRX_NAMES.values() for m, names in mods.items() for n in _names(names)}
    known |= {(m, WHOLE_MODULE) for mods in NVRX_NAMES.values() for m in mods}
    stale = sorted(k for k in left_out if k not in known)
    assert not stale, f"docs/impl.md leaves out {stale}, which no NVRx release in the manifest has"
    present = [(m, n) for m, n in left_out if _present(package, m, n)]
    assert not present, f"docs/impl.md leaves out {present}, which {package} has: remove them from its table"
