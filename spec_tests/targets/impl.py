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
        "protocol",
    }
)
EXPECTATIONS = str(Path(__file__).with_name("impl.expectations.toml"))


def protocol_saver(persistent: bool | None = None):
    """The protocol interface over the NVRx guide's recipe (spec_tests.targets._queue_saver)."""
    from spec_tests.targets._queue_saver import saver_of

    return saver_of(NAME, persistent)
