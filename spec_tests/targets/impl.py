"""Adapter for `impl`, this project's reference implementation."""

from pathlib import Path

NAME = "impl"
DISTRIBUTION = None
MODULES = {
    path: "impl." + path
    for path in (
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
}
CAPABILITIES = frozenset({
    "persistent_caller", "temporal_caller", "torch_async_checkpoint", "no_process_group",
    "storage_writer", "msc", "local_checkpointing",
})
EXPECTATIONS = str(Path(__file__).with_name("impl.expectations.toml"))
