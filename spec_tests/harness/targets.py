"""Implementations under test ("targets") and how every process resolves the same one.

A target is described by one adapter module. The adapter is the only place that knows the
target's internals; tests reach the target through `Target.module(...)` and the adapter's
capabilities. An adapter module defines:

    NAME: str                      short name used with --impl
    DISTRIBUTION: str | None       pip distribution, for the version in reports
    MODULES: dict[str, str]        spec module path (e.g. "async_ckpt.core") -> importable module
    CAPABILITIES: frozenset[str]   features the target provides (see CAPABILITY_DOCS)
    EXPECTATIONS: str | None       path of its expectations file (known failures, strict xfail)
    def install() -> None          optional; called once per process before first use

Resolution order of the target name: `--impl NAME`, then the environment variable
`CKPTSPEC_IMPL`, then "impl". The plugin writes the resolved name back into the environment
so xdist workers, rank processes and their children resolve the same target. NAME is a
built-in, a name registered under the entry-point group "ckptspec.targets" (value: the adapter
module), or the dotted path of an adapter module.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from importlib import metadata
from types import ModuleType

__all__ = [
    "CAPABILITY_DOCS", "ENV_VAR", "MissingCapability", "SPEC_MODULES", "Target", "current_target", "load_target",
]

ENV_VAR = "CKPTSPEC_IMPL"
ENTRY_POINT_GROUP = "ckptspec.targets"
BUILTIN = {
    "impl": "spec_tests.targets.impl",
    "nvrx": "spec_tests.targets.nvrx",
    "mcore": "spec_tests.targets.mcore",
}
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
}


class MissingCapability(LookupError):
    """The target does not provide a module or feature a test needs."""


@dataclass(frozen=True)
class Target:
    name: str
    adapter: ModuleType

    @property
    def capabilities(self) -> frozenset[str]:
        return frozenset(self.adapter.CAPABILITIES)

    @property
    def version(self) -> str:
        dist = getattr(self.adapter, "DISTRIBUTION", None)
        if dist is None:
            return "(source tree)"
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return "(not installed)"

    @property
    def expectations_path(self) -> str | None:
        return getattr(self.adapter, "EXPECTATIONS", None)

    def module(self, spec_path: str) -> ModuleType:
        """The target's module for a spec path such as "async_ckpt.core"."""
        try:
            dotted = self.adapter.MODULES[spec_path]
        except KeyError:
            raise MissingCapability(f"target {self.name!r} has no module for {spec_path!r}") from None
        return importlib.import_module(dotted)

    def has(self, *capabilities: str) -> bool:
        return set(capabilities) <= self.capabilities

    def __reduce__(self):
        # Rank processes receive the name and resolve (and install) the adapter themselves.
        return (load_target, (self.name,))


_loaded: dict[str, Target] = {}


def _adapter_module_name(name: str) -> str:
    if name in BUILTIN:
        return BUILTIN[name]
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name == name:
            return ep.value
    if "." in name:
        return name
    known = sorted(set(BUILTIN) | {ep.name for ep in metadata.entry_points(group=ENTRY_POINT_GROUP)})
    raise ValueError(f"unknown target {name!r}; known targets: {', '.join(known)}, "
                     "or the dotted path of an adapter module")


def load_target(name: str) -> Target:
    """Import the adapter of `name`, run its install() once in this process, return the Target."""
    if name not in _loaded:
        adapter = importlib.import_module(_adapter_module_name(name))
        install = getattr(adapter, "install", None)
        if install is not None:
            install()
        _loaded[name] = Target(name=name, adapter=adapter)
    return _loaded[name]


def current_target() -> Target:
    """The target named by the environment (set by the plugin in every process)."""
    return load_target(os.environ.get(ENV_VAR, "impl"))
