"""The adapter contract as types: what an adapter module defines, checked by mypy and, at load, by the loader.

An adapter module is checked against these `typing.Protocol` classes (mypy accepts a module where a protocol is
expected and checks its names and signatures):

    if TYPE_CHECKING:
        import my_package.ckptspec_adapter as _adapter
        from spec_tests.harness.target.contract import ProtocolAdapter
        _checked: ProtocolAdapter = _adapter

`spec_tests/targets/_typed.py` does that for every built-in adapter. At load, `spec_tests.harness.target.loading` checks
the same names at run time (`adapter_problem`, one line naming what is missing), so a broken adapter stops the run
before the first test instead of failing a clause.

Names (the optional ones may be left out; the loader supplies the default):

    NAME: str                          the short name, used in messages
    DISTRIBUTION: str | None           the pip distribution whose version the report shows (None: source tree)
    MODULES: dict[str, str]            spec module path (targets.SPEC_MODULES) -> importable module (route 1)
    CAPABILITIES: frozenset[str]       what the target provides (targets.CAPABILITY_DOCS)
    EXPECTATIONS: str | None           the path of its expectations file (known failures)
    INSTALL: str                       optional: the command that installs the target
    PACKAGES: tuple[str, ...]          optional: importable modules the target needs besides MODULES' (route 2)
    NCCL_BACKEND: str                  optional: the trainer's process group where a test asks for NCCL
    FORMAT: CheckpointFormat           optional: how its checkpoints lie on disk (formats.DCP by default)
    install() -> None                  optional: called once per process before first use
    protocol_saver(**options) -> Saver with capability "protocol": a new saver (protocol.SAVER_OPTIONS)
    checkpoint_manager(root, keep) -> CheckpointManager
                                       with capability "manager": a new manager over `root` retaining `keep`
                                       checkpoints (0: all; spec_tests.harness.target.manager)
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from spec_tests.harness.target.manager import CheckpointManager
    from spec_tests.harness.target.protocol import Saver

__all__ = ["AdapterModule", "ManagerAdapter", "ProtocolAdapter", "SaverFactory"]


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


class ManagerAdapter(AdapterModule, Protocol):
    """An adapter with capability "manager": it also makes checkpoint managers (spec_tests.harness.target.manager)."""

    def checkpoint_manager(self, root: str, keep: int) -> CheckpointManager: ...
