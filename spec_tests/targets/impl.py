"""Adapter for `impl`, this project's reference implementation."""

from pathlib import Path

NAME = "impl"
DISTRIBUTION = None
MODULES = {
    "async_ckpt.core": "impl.async_ckpt.core",
    "async_ckpt.torch_ckpt": "impl.async_ckpt.torch_ckpt",
}
CAPABILITIES = frozenset({
    "persistent_caller", "temporal_caller", "torch_async_checkpoint", "no_process_group",
})
EXPECTATIONS = str(Path(__file__).with_name("impl.expectations.toml"))
