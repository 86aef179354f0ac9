"""Implementations under test ("targets") and how every process resolves the same one.

A target is described by one adapter module. The adapter is the only place that knows the
target's internals; tests reach the target through `Target.module(...)` and the adapter's
capabilities. What an adapter module defines is ckptspec.spec.harness.surface.contract's (its Protocols,
checked here at load by `_check_contract`).

Resolution order of the target name: `--impl NAME`, then the environment variable
`CKPTSPEC_IMPL`, then "impl". The plugin writes the resolved name back into the environment
so xdist workers, rank processes and their children resolve the same target. NAME is
- a built-in: a module of the package `ckptspec.spec.targets` whose name does not start with `_`
  (discovered, so a new adapter there needs no change here); an underscore in the module name is a
  hyphen in the target name (`dcp_thread.py` is target `dcp-thread`),
- a name registered under the entry-point group "ckptspec.targets" (value: the adapter module),
- or the (dotted) name of an importable adapter module.

Errors (one line each, for the plugin to show as a usage error): an unknown name or an adapter
that breaks the contract above is a `TargetError` (a ValueError); a target whose package cannot be
imported is a `TargetUnavailable` (an ImportError), naming the package and the adapter's INSTALL.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pkgutil
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType

from ckptspec.report.provenance import NO_EXPECTATIONS_VAR
from ckptspec.spec.harness.surface import contract
from ckptspec.spec.harness.surface.formats import DCP, CheckpointFormat

SUPPORTED_TORCH = "2.11"  # pyproject.toml's torch>= (harness_tests/test_torch_floor.py checks they agree)

__all__ = [
    "CAPABILITY_DOCS",
    "ENV_VAR",
    "EXPECTATIONS_VAR",
    "SPEC_MODULES",
    "MissingCapability",
    "Target",
    "TargetError",
    "TargetUnavailable",
    "builtin_targets",
    "checkpoint_format",
    "current_target",
    "known_targets",
    "load_target",
    "torch_below_supported",
]

ENV_VAR = "CKPTSPEC_IMPL"
EXPECTATIONS_VAR = "CKPTSPEC_EXPECTATIONS"  # a path in place of the adapter's EXPECTATIONS
ENTRY_POINT_GROUP = "ckptspec.targets"
BUILTIN_PACKAGE = "ckptspec.spec.targets"
# Every spec module path, i.e. a module path below `nvidia_resiliency_ext.checkpointing`.
SPEC_MODULES = (
    "async_ckpt.core",
    "async_ckpt.torch_ckpt",
    "async_ckpt.filesystem_async",
    "async_ckpt.state_dict_saver",
    "async_ckpt.cached_metadata_filesystem_reader",
    "local.base_state_dict",
    "local.basic_state_dict",
    "local.ckpt_managers.base_manager",
    "local.ckpt_managers.local_manager",
    "local.replication.strategies",
)
CAPABILITY_DOCS = {
    "persistent_caller": "PersistentAsyncCaller and AsyncCallsQueue(persistent=True)",
    "temporal_caller": "TemporalAsyncCaller and AsyncCallsQueue(persistent=False)",
    "torch_async_checkpoint": "async_ckpt.torch_ckpt.TorchAsyncCheckpoint",
    "no_process_group": "the async core usable without torch.distributed initialised",
    "storage_writer": "async_ckpt.filesystem_async.FileSystemWriterAsync and async_ckpt.state_dict_saver",
    "msc": "FileSystemWriterAsync(use_msc=True) writing msc:// URLs through multi-storage-client",
    "local_checkpointing": "local.* (TensorAwareStateDict, LocalCheckpointManager, CliqueReplicationStrategy)",
    "protocol": "protocol_saver(**options) in the adapter: start, staged, wait, abort, close (ckptspec.spec.harness.surface.saver_api)",
    "manager": "checkpoint_manager(root, keep) in the adapter: save, wait, latest, resume, close (ckptspec.spec.harness.surface.manager_api)",
    "manager_retention": "a manager that honours its retention setting `keep` (0: retain all; k: the k newest)",
    "manager_pointer": "a manager that publishes a pointer (tracker) file naming its latest checkpoint",
    "manager_ranks": "a manager whose save and resume are one job's over every rank (each rank its own state)",
    "manager_sigterm_save": "a manager that offers a save on SIGTERM: enable_save_on_sigterm(), then advance(step, state) between saves (manager_api.py)",
}


class MissingCapability(LookupError):
    """The target does not provide a module or feature a test needs."""


class TargetError(ValueError):
    """An unknown target name, or an adapter that breaks the adapter contract."""


class TargetUnavailable(ImportError):
    """The target's package cannot be imported here (not installed, or broken)."""


@dataclass(frozen=True)
class Target:
    name: str
    adapter: ModuleType

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset(self.adapter.CAPABILITIES)

    @property
    def version(self) -> str:
        """The version of the installed DISTRIBUTION whose files this process imports (never an assumed one)."""
        dist = getattr(self.adapter, "DISTRIBUTION", None)
        if dist is None:
            return "(source tree)"
        return _imported_version(dist, _packages(self.adapter))

    @property
    def expectations_path(self) -> str | None:
        """Its expectations file; None with $CKPTSPEC_NO_EXPECTATIONS set (a version with no recorded run); the path
        in $CKPTSPEC_EXPECTATIONS in place of the adapter's (the reusable workflow's `expectations` input)."""
        if os.environ.get(NO_EXPECTATIONS_VAR):
            return None
        return os.environ.get(EXPECTATIONS_VAR) or getattr(self.adapter, "EXPECTATIONS", None)

    def module(self, spec_path: str) -> ModuleType:
        """The target's module for a spec path such as "async_ckpt.core"."""
        try:
            dotted = self.adapter.MODULES[spec_path]
        except KeyError:
            raise MissingCapability(f"target {self.name!r} has no module for {spec_path!r}") from None
        return importlib.import_module(dotted)

    @property
    def format(self) -> CheckpointFormat:
        """How its checkpoints lie on disk and are read back: the adapter's FORMAT, or torch DCP's."""
        return getattr(self.adapter, "FORMAT", DCP)

    def backend(self, requested: str) -> str:
        """The backend string the trainer's process group is made with when a test asks for `requested`."""
        return getattr(self.adapter, "NCCL_BACKEND", "nccl") if requested == "nccl" else requested

    def has(self, *capabilities: str) -> bool:
        return set(capabilities) <= self.capabilities

    def __reduce__(self) -> tuple[Callable[[str], Target], tuple[str]]:
        # Rank processes receive the name and resolve (and install) the adapter themselves.
        return (load_target, (self.name,))


def _imported_version(dist: str, modules: Iterable[str]) -> str:
    """The version of the copy of `dist` that provides the top-level packages of `modules` on this sys.path.

    With two copies installed (a venv's and one on PYTHONPATH), the one imported wins, not the first metadata found.
    """
    roots = {dotted.split(".")[0] for dotted in modules}
    locations: set[str] = set()
    for root in roots:
        spec = importlib.util.find_spec(root)
        if spec is not None:
            locations.update(os.path.realpath(p) for p in spec.submodule_search_locations or [])
    for distribution in metadata.distributions(name=dist):
        if any(os.path.realpath(str(distribution.locate_file(root))) in locations for root in roots):
            return distribution.version
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "(not installed)"


_loaded: dict[str, Target] = {}


def builtin_targets() -> dict[str, str]:
    """Name -> adapter module of the adapters in the package `ckptspec.spec.targets` (names not starting with `_`;
    `_` in a module name is `-` in the target name)."""
    package = importlib.import_module(BUILTIN_PACKAGE)
    return {
        info.name.replace("_", "-"): f"{BUILTIN_PACKAGE}.{info.name}"
        for info in pkgutil.iter_modules(package.__path__)
        if not info.ispkg and not info.name.startswith("_")
    }


def known_targets() -> dict[str, str]:
    """Name -> adapter module of every target known by name: the built-ins, then the entry points."""
    known = builtin_targets()
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        known.setdefault(ep.name, ep.value)
    return known


def _unknown(name: str, known: Iterable[str]) -> TargetError:
    return TargetError(
        f"unknown target {name!r}; known targets: {', '.join(sorted(known))}, or the dotted path of an adapter module"
    )


def _unavailable(name: str, adapter: ModuleType, exc: ImportError) -> TargetUnavailable:
    dist = getattr(adapter, "DISTRIBUTION", None)
    package = dist or f"the package of target {name!r}"
    hint = getattr(adapter, "INSTALL", None)
    how = f"; install it with: {hint}" if hint else ""
    version = _installed(dist) if dist else None
    if version is not None:  # installed, but importing it (or what the adapter needs of it) fails: the environment's
        return TargetUnavailable(
            f"target {name!r}: {dist} {version} is installed but cannot be set up here "
            f"({type(exc).__name__}: {exc}); nothing was judged{how}",
            name=exc.name,
        )
    return TargetUnavailable(f"target {name!r} needs {package}, which cannot be imported ({exc}){how}", name=exc.name)


def _installed(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def adapter_problem(adapter: ModuleType, spec_modules: Iterable[str], capability_docs: Mapping[str, str]) -> str | None:
    """What `adapter` lacks or gets wrong, in one line, or None: every name the harness will use, checked now
    (the names, types and signatures of ckptspec.spec.harness.surface.contract, then what no type says: spec module
    paths and capabilities this suite knows, an expectations file that exists)."""
    capabilities = getattr(adapter, "CAPABILITIES", None)
    if isinstance(capabilities, (set, frozenset)):  # first: a misspelt capability also unpairs its function
        unknown = sorted(str(c) for c in set(capabilities) - set(capability_docs))
        if unknown:
            return f"declares unknown capabilities {', '.join(unknown)}; known: {', '.join(capability_docs)}"
    wrong = contract.problem(adapter)
    if wrong:
        return wrong
    unknown_modules = sorted(set(adapter.MODULES) - set(spec_modules))
    if unknown_modules:
        return f"MODULES maps unknown spec module paths {', '.join(unknown_modules)} (put other modules in PACKAGES)"
    if adapter.EXPECTATIONS is not None and not _exists(adapter.EXPECTATIONS):
        return f"EXPECTATIONS names {adapter.EXPECTATIONS}, which does not exist"
    return None


def _exists(path: str) -> bool:
    return os.path.isfile(path)


def _check_contract(name: str, adapter: ModuleType) -> None:
    """Every name the harness will use of `adapter`, checked at load (ckptspec.spec.harness.surface.contract): a TargetError
    naming what is missing or wrong, in one line."""
    problem = adapter_problem(adapter, SPEC_MODULES, CAPABILITY_DOCS)
    if problem:
        raise TargetError(
            f"adapter {adapter.__name__} of target {name!r} {problem}; see ckptspec.spec.harness.surface.contract"
        )


def _packages(adapter: ModuleType) -> list[str]:
    """The importable modules the target needs: MODULES' values, then PACKAGES (route 2)."""
    return [*adapter.MODULES.values(), *getattr(adapter, "PACKAGES", ())]


def _import_adapter(name: str) -> ModuleType:
    known = known_targets()
    dotted = known.get(name, name)
    try:
        return importlib.import_module(dotted)
    except ModuleNotFoundError as exc:
        if exc.name is None or not (dotted + ".").startswith(exc.name + "."):
            raise TargetUnavailable(
                f"target {name!r}: its adapter {dotted} cannot be imported ({exc})", name=exc.name
            ) from exc
        if name in known or "." in name:
            raise TargetError(f"target {name!r}: no adapter module {dotted!r}") from None
        raise _unknown(name, known) from None


def load_target(name: str) -> Target:
    """Import the adapter of `name`, run its install() once in this process, return the Target.

    Raises TargetError (unknown name, broken adapter) or TargetUnavailable (the target's package is missing, or
    installed and fails to import: the error names the cause and the installed version).
    """
    if name not in _loaded:
        adapter = _import_adapter(name)
        _check_contract(name, adapter)
        try:
            for root in sorted({dotted.split(".")[0] for dotted in _packages(adapter)}):
                if importlib.util.find_spec(root) is None:
                    raise ModuleNotFoundError(f"No module named {root!r}", name=root)
                importlib.import_module(root)  # installed but broken (a dependency missing): stop here, not per test
            install = getattr(adapter, "install", None)
            if install is not None:
                install()
        except ImportError as exc:
            raise _unavailable(name, adapter, exc) from exc
        _loaded[name] = Target(name=name, adapter=adapter)
    return _loaded[name]


def current_target() -> Target:
    """The target named by the environment (set by the plugin in every process)."""
    return load_target(os.environ.get(ENV_VAR, "impl"))


def checkpoint_format(target: Target | None = None) -> CheckpointFormat:
    """The checkpoint format of `target` (the current one by default): Target.format."""
    return (target or current_target()).format


def torch_below_supported() -> str | None:
    """A line for the session header when the installed torch is older than SUPPORTED_TORCH (pyproject.toml's
    floor, which harness_tests/test_torch_floor.py keeps equal): verdicts on an older torch are not this suite's."""
    import torch
    from packaging.version import Version

    if Version(torch.__version__.split("+", 1)[0]) >= Version(SUPPORTED_TORCH):
        return None
    return (
        f"torch {torch.__version__} is older than {SUPPORTED_TORCH}, the oldest this suite supports: "
        "impl's verdicts on it are not the spec's"
    )
