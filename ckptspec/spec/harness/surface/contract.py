"""The adapter contract, stated once: the names an adapter module defines, as `typing.Protocol` classes.

Everything else is derived from the classes below, so the contract cannot say two things:

- mypy checks a module against them (a module fits a protocol when it has its names and signatures):

      if TYPE_CHECKING:
          import my_package.ckptspec_adapter as _adapter
          from ckptspec.spec.harness.surface.contract import ProtocolAdapter
          _checked: ProtocolAdapter = _adapter

  (`ckptspec/spec/targets/_typed.py` does it for every built-in adapter);
- the loader checks a module at load (`problem`, one line naming what is missing or wrong), from `members()`: each
  name's type annotation (checked element by element) or signature (the parameters it must accept);
- the table of docs/adding-a-target.md is generated from the same members and their docstrings
  (`python -m ckptspec.spec.harness.surface.contract --update docs/adding-a-target.md`).

`AdapterModule` holds the names every adapter defines, `AdapterOptions` those it may leave out (the loader supplies
the default its docstring names), and each of `ProtocolAdapter` and `ManagerAdapter` the function a capability
requires (`CAPABILITY_PROTOCOLS`): defined exactly when the capability is declared. What no type can say (which
spec module paths and capability names exist, that the expectations file exists) the loader checks after these.
"""

from __future__ import annotations

import argparse
import inspect
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Union, get_args, get_origin, get_type_hints

from ckptspec.spec.harness.surface.formats import CheckpointFormat

if TYPE_CHECKING:
    from ckptspec.spec.harness.surface.manager_api import CheckpointManager
    from ckptspec.spec.harness.surface.saver_api import Saver

__all__ = [
    "CAPABILITY_PROTOCOLS",
    "AdapterModule",
    "AdapterOptions",
    "ManagerAdapter",
    "Member",
    "ProtocolAdapter",
    "members",
    "problem",
    "table",
]


class AdapterModule(Protocol):
    """The names every adapter module defines; read-only, so a module's narrower types fit."""

    @property
    def NAME(self) -> str:
        """the short name, used in messages"""

    @property
    def DISTRIBUTION(self) -> str | None:
        """the pip distribution; the report shows the version actually imported (`None`: "source tree")"""

    @property
    def MODULES(self) -> dict[str, str]:
        """spec module path -> importable module (route 1; `{}` for route 2 alone); only the paths listed below"""

    @property
    def CAPABILITIES(self) -> frozenset[str]:
        """what the target provides (the capability table below); an unknown name is an error"""

    @property
    def EXPECTATIONS(self) -> str | None:
        """the path of its expectations file (known failures); it must exist"""


class AdapterOptions(Protocol):
    """The names an adapter may leave out; the loader then uses the default each names."""

    @property
    def INSTALL(self) -> str:
        """the command that installs the target, shown when it cannot be imported (default: none shown)"""

    @property
    def PACKAGES(self) -> tuple[str, ...]:
        """route 2: the modules the adapter imports besides MODULES' (its availability check and version)"""

    @property
    def NCCL_BACKEND(self) -> str:
        """the trainer's process group where a test asks for NCCL (default `"nccl"`; DCP: `"cpu:gloo,cuda:nccl"`)"""

    @property
    def FORMAT(self) -> CheckpointFormat:
        """route 2: how its checkpoints lie on disk and are read back (default: torch DCP's; formats.py)"""

    def install(self) -> None:
        """called once per process before first use (patching, environment set-up)"""


class ProtocolAdapter(AdapterModule, Protocol):
    """An adapter with capability "protocol" (route 2): it also makes savers."""

    def protocol_saver(self, **options: Any) -> Saver:
        """with capability `protocol`: a new `Saver` (saver_api.py); accepts `**options`, ignores those it does not
        know (saver_api.SAVER_OPTIONS)"""


class ManagerAdapter(AdapterModule, Protocol):
    """An adapter with capability "manager": it also makes checkpoint managers (ckptspec.spec.harness.surface.manager_api)."""

    def checkpoint_manager(self, root: str, keep: int) -> CheckpointManager:
        """with capability `manager`: a new `CheckpointManager` (manager_api.py) over `root` retaining `keep`
        checkpoints (0: all)"""


# The capability that requires each protocol's own functions (and forbids them without it).
CAPABILITY_PROTOCOLS: dict[str, type] = {"protocol": ProtocolAdapter, "manager": ManagerAdapter}


@dataclass(frozen=True)
class Member:
    """One name of the contract: a value with its `annotation`, or a function with its `signature` (no `self`)."""

    name: str
    doc: str
    required: bool
    capability: str | None = None  # the capability that requires it (CAPABILITY_PROTOCOLS)
    annotation: Any = None
    signature: inspect.Signature | None = None

    @property
    def shown(self) -> str:
        """How the docs' table names it: `NAME`, or `protocol_saver(**options)`."""
        if self.signature is None:
            return self.name
        stars: dict[Any, str] = {inspect.Parameter.VAR_POSITIONAL: "*", inspect.Parameter.VAR_KEYWORD: "**"}
        names = [stars.get(p.kind, "") + p.name for p in self.signature.parameters.values()]
        return f"{self.name}({', '.join(names)})"

    @property
    def type_text(self) -> str:
        """Its type as the docs' table and the loader's messages say it: `function`, or the annotation's text."""
        return "function" if self.signature is not None else describe(self.annotation)


def _own_members(protocol: type, required: bool, capability: str | None) -> list[Member]:
    found = []
    for name, attr in vars(protocol).items():
        if isinstance(attr, property) and attr.fget is not None:
            hints = get_type_hints(attr.fget)
            found.append(Member(name, _doc(attr.fget), required, capability, annotation=hints["return"]))
        elif inspect.isfunction(attr) and not name.startswith("_"):
            signature = inspect.signature(attr)
            parameters = list(signature.parameters.values())[1:]  # without self
            found.append(
                Member(name, _doc(attr), required, capability, signature=signature.replace(parameters=parameters))
            )
    return found


def _doc(func: Callable[..., Any]) -> str:
    return " ".join((inspect.getdoc(func) or "").split())


def members() -> list[Member]:
    """Every name of the contract, in the order the classes above state them."""
    found = _own_members(AdapterModule, True, None) + _own_members(AdapterOptions, False, None)
    for capability, protocol in CAPABILITY_PROTOCOLS.items():
        found += _own_members(protocol, True, capability)
    return found


def describe(annotation: Any) -> str:
    """An annotation as a reader writes it: `str | None`, `tuple[str, ...]`, a class by its dotted name."""
    if annotation is None or annotation is type(None):
        return "None"
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return " | ".join(describe(arg) for arg in get_args(annotation))
    if origin is not None:
        args = ", ".join("..." if arg is Ellipsis else describe(arg) for arg in get_args(annotation))
        return f"{origin.__name__}[{args}]"
    if annotation.__module__ == "builtins":
        return str(annotation.__name__)
    return f"{annotation.__module__}.{annotation.__qualname__}"


def conforms(value: Any, annotation: Any) -> bool:
    """Whether `value` is of the type `annotation` says, containers element by element."""
    if annotation is Any:
        return True
    if annotation is None or annotation is type(None):
        return value is None
    origin = get_origin(annotation)
    if origin in (Union, types.UnionType):
        return any(conforms(value, arg) for arg in get_args(annotation))
    if origin is None:
        return isinstance(value, annotation)
    if not isinstance(value, origin):
        return False
    args = get_args(annotation)
    if origin is dict:
        return all(conforms(k, args[0]) and conforms(v, args[1]) for k, v in value.items())
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        return all(conforms(item, args[0]) for item in value)
    if origin in (frozenset, set, list):
        return all(conforms(item, args[0]) for item in value)
    return True


def _accepts(func: Any, wanted: inspect.Signature) -> str | None:
    """What of `wanted`'s parameters `func` cannot take, or None."""
    try:
        have = inspect.signature(func).parameters
    except (TypeError, ValueError):
        return "has no signature to check"
    kinds = {p.kind for p in have.values()}
    for parameter in wanted.parameters.values():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            if inspect.Parameter.VAR_KEYWORD not in kinds:
                return f"must accept **{parameter.name}"
        elif parameter.name not in have and inspect.Parameter.VAR_KEYWORD not in kinds:
            return f"must accept the parameter {parameter.name}"
    required = [
        p.name
        for p in have.values()
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and p.name not in wanted.parameters
    ]
    return f"requires {', '.join(required)}, which the harness never passes" if required else None


def problem(adapter: types.ModuleType) -> str | None:
    """What `adapter` lacks or gets wrong against members(), in one line, or None."""
    capabilities: Any = getattr(adapter, "CAPABILITIES", frozenset())
    for member in members():
        present = hasattr(adapter, member.name)
        value = getattr(adapter, member.name, None)
        if member.capability is not None and present and member.capability not in capabilities:
            return f'defines {member.name} but does not declare capability "{member.capability}"'
        needed = member.required and (member.capability is None or member.capability in capabilities)
        if not present:
            if needed:
                why = f'declares capability "{member.capability}" but ' if member.capability else ""
                return f"{why}defines no {member.shown} ({member.type_text})"
            continue
        if member.signature is not None:
            if not callable(value):
                return f"{member.name} must be a function, not {type(value).__name__}"
            wrong = _accepts(value, member.signature)
            if wrong:
                return f"{member.name} {wrong}"
        elif not conforms(value, member.annotation):
            return f"{member.name} must be {describe(member.annotation)}, not {_shape(value)}"
    return None


def _shape(value: Any) -> str:
    if isinstance(value, (tuple, list, set, frozenset)) and value:
        return f"{type(value).__name__} holding {type(next(iter(value))).__name__}"
    return type(value).__name__


def table() -> str:
    """The contract as the Markdown table of docs/adding-a-target.md (one row per member)."""
    rows = ["| name | type | what |", "| --- | --- | --- |"]
    for member in members():
        kind = member.type_text if member.signature is not None else f"`{member.type_text}`"
        optional = "" if member.required else ", optional"
        cells = (f"`{member.shown}`", kind + optional, member.doc)
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    from ckptspec.report.blocks import markers, write_block

    parser = argparse.ArgumentParser(prog="python -m ckptspec.spec.harness.surface.contract", description=table.__doc__)
    parser.add_argument("--update", type=Path, help="put the table between the contract block's markers of this file")
    args = parser.parse_args(argv)
    write_block(table(), args.update, *markers("contract"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
