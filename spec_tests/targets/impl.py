"""Adapter for `impl`, this project's reference implementation."""

from pathlib import Path

from spec_tests.harness.targets import SPEC_MODULES

NAME = "impl"
DISTRIBUTION = None
MODULES = {path: "impl." + path for path in SPEC_MODULES}
CAPABILITIES = frozenset(
    {
        "persistent_caller",
        "temporal_caller",
        "torch_async_checkpoint",
        "no_process_group",
        "storage_writer",
        "msc",
        "local_checkpointing",
    }
)
EXPECTATIONS = str(Path(__file__).with_name("impl.expectations.toml"))
