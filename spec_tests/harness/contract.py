"""The adapter contract as types: what an adapter module defines, checked by mypy and, at load, by the loader.

An adapter module is checked against these `typing.Protocol` classes (mypy accepts a module where a protocol is
expected and checks its names and signatures):

    if TYPE_CHECKING:
        import my_package.ckptspec_adapter as _adapter
        from spec_tests.harness.contract import ProtocolAdapter
        _checked: ProtocolAdapter = _adapter

`spec_tests/targets/_typed.py` does that for every built-in adapter. At load, `spec_tests.harness.targets` checks
the same names at run time (`check_adapter`, one line naming what is missing), so a broken adapter stops the run
before the first test instead of failing a clause.

Names (the optional ones may be left out; the loader supplies the default):

    NAME: str                          the short name, used in messages
    DISTRIBUTION: str | None           the pip distribution whose version the report shows (None: source tree)
    MODULES: dict[str, str]            spec module path (targets.SPEC_MODULES) -> importable module (route 1)
    CAPABILITIES: frozenset[str]       what the target provides (targets.CAPABILITY_DOCS)
    EXPECTATIONS: str | None           the path of its expectations file (known failures)
    INSTALL: str                       optional: the command that installs the target
    PACKAGES: tuple[str, ...]          optional: importable modules the target needs besides MODULES' (route 2)
    FORMAT: CheckpointFormat           optional: how its checkpoints lie on disk (formats.DCP by default)
    install() -> None                  optional: called once per process before first use
    protocol_saver(**options) -> Saver with capability "protocol": a new saver (protocol.SAVER_OPTIONS)
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from types import ModuleType
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from spec_tests.harness.protocol import Saver

__all__ = ["AdapterModule", "ProtocolAdapter", "SaverFactory", "adapter_problem"]


class AdapterModule(Protocol):
    """The names every adapter module defines (route 1 and route 2); read-only, so a module's narrower types fit."""

    @property
    def NAME(self) -> str: ...
    @property
    def DISTRIBUTION(self) -> str | None: ...
    @property
    def MODULES(self) -> dict[str, str]: ...
    @property
    def CAPABILITIES(self) -> frozenset[str]: ...
    @property
    def EXPECTATIONS(self) -> str | None: ...


class SaverFactory(Protocol):
    """`protocol_saver`: one signature for every target; unknown options are ignored (protocol.SAVER_OPTIONS)."""

    def __call__(self, **options: Any) -> Saver: ...


class ProtocolAdapter(AdapterModule, Protocol):
    """An adapter with capability "protocol" (route 2): it also makes savers."""

    def protocol_saver(self, **options: Any) -> Saver: ...


_REQUIRED: dict[str, tuple[tuple[type, ...], str]] = {
    "NAME": ((str,), "a str"),
    "DISTRIBUTION": ((str, type(None)), "a str or None"),
    "MODULES": ((dict,), "a dict"),
    "CAPABILITIES": ((frozenset, set), "a frozenset"),
    "EXPECTATIONS": ((str, type(None)), "a str or None"),
}
_OPTIONAL: dict[str, tuple[tuple[type, ...], str]] = {
    "INSTALL": ((str,), "a str"),
    "PACKAGES": ((tuple, list), "a tuple of module names"),
}


def _takes_any_option(func: Callable) -> bool:
    try:
        parameters = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def adapter_problem(adapter: ModuleType, spec_modules, capability_docs) -> str | None:
    """What `adapter` lacks or gets wrong, in one line, or None: every name the harness will use, checked now."""
    for name, (types, what) in _REQUIRED.items():
        if not hasattr(adapter, name):
            return f"defines no {name} ({what})"
        if not isinstance(getattr(adapter, name), types):
            return f"{name} must be {what}, not {type(getattr(adapter, name)).__name__}"
    for name, (types, what) in _OPTIONAL.items():
        if hasattr(adapter, name) and not isinstance(getattr(adapter, name), types):
            return f"{name} must be {what}, not {type(getattr(adapter, name)).__name__}"
    unknown_modules = sorted(set(adapter.MODULES) - set(spec_modules))
    if unknown_modules:
        return f"MODULES maps unknown spec module paths {', '.join(unknown_modules)} (put other modules in PACKAGES)"
    unknown = sorted(set(adapter.CAPABILITIES) - set(capability_docs))
    if unknown:
        return f"declares unknown capabilities {', '.join(unknown)}; known: {', '.join(capability_docs)}"
    if adapter.EXPECTATIONS is not None and not _exists(adapter.EXPECTATIONS):
        return f"EXPECTATIONS names {adapter.EXPECTATIONS}, which does not exist"
    if hasattr(adapter, "install") and not callable(adapter.install):
        return "install must be a function"
    fmt = getattr(adapter, "FORMAT", None)
    if fmt is not None and not all(callable(getattr(fmt, m, None)) for m in ("data_file", "committed", "load")):
        return "FORMAT must be a spec_tests.harness.formats.CheckpointFormat (data_file, committed, load)"
    make = getattr(adapter, "protocol_saver", None)
    if "protocol" in adapter.CAPABILITIES:
        if not callable(make):
            return 'declares capability "protocol" but defines no protocol_saver(**options)'
        if not _takes_any_option(make):
            return "protocol_saver must accept **options (the tests pass options such as persistent=False)"
    elif make is not None:
        return 'defines protocol_saver but does not declare capability "protocol"'
    return None


def _exists(path: str) -> bool:
    import os

    return os.path.isfile(path)
