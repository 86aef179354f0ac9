"""Adapter for Megatron-Core 0.16.1 and 0.19.2 (`megatron.core.dist_checkpointing.strategies.async_utils`).

Megatron-Core provides the async core only (no TorchAsyncCheckpoint). On a machine without a GPU,
`install()` applies `_cpu_cuda` to `async_utils`, in this process and in spawned persistent workers
(whose loop calls `torch.cuda.set_device(rank % device_count())`), and to the writer and saver modules that the
protocol interface uses (`strategies.filesystem_async`, `strategies.state_dict_saver`). Nothing else is changed.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ckptspec.spec.targets import _cpu_cuda

if TYPE_CHECKING:
    from ckptspec.spec.targets._queue_saver import QueueSaver

NAME = "mcore"
DISTRIBUTION = "megatron-core"
INSTALL = 'pip install "torch==2.13.0" -e ".[test,mcore]"'
MODULES = {"async_ckpt.core": "megatron.core.dist_checkpointing.strategies.async_utils"}
CAPABILITIES = frozenset({"persistent_caller", "temporal_caller", "protocol"})
EXPECTATIONS = str(Path(__file__).with_name("mcore.expectations.toml"))
_STRATEGIES = "megatron.core.dist_checkpointing.strategies."
# The protocol interface uses Megatron-Core's own writer and saver, which call torch.cuda too.
_PROTOCOL_MODULES = (MODULES["async_ckpt.core"], _STRATEGIES + "filesystem_async", _STRATEGIES + "state_dict_saver")


def install() -> None:
    from megatron.core.dist_checkpointing.strategies.async_utils import PersistentAsyncCaller

    _cpu_cuda.install_for(NAME, [*MODULES.values(), *_PROTOCOL_MODULES[1:]], PersistentAsyncCaller)


def protocol_saver(**options: Any) -> QueueSaver:
    """The protocol interface over Megatron-Core's own writer and saver (same recipe as NVRx's)."""
    from ckptspec.spec.targets._queue_saver import saver_of

    return saver_of(NAME, options.get("persistent"), _PROTOCOL_MODULES)
