"""mypy checks every built-in adapter module against the adapter contract (ckptspec.spec.harness.surface.contract).

Nothing here runs: under TYPE_CHECKING each adapter module is assigned to the protocol it must satisfy, so a
missing name or a wrong signature (a `protocol_saver` without `**options`) is a type error in CI. A new adapter
adds its line (harness_tests/test_contract.py fails until it does).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ckptspec.spec.harness.surface.contract import ManagerAdapter, ProtocolAdapter
    from ckptspec.spec.targets import (
        dcp_process,
        dcp_staged,
        dcp_thread,
        deepspeed,
        deepspeed_decoupled,
        impl,
        impl_local,
        lightning,
        mcore,
        nvrx,
        olmo_core,
        torch_checkpointing,
        torch_checkpointing_buffered,
        torchtitan,
        transformers,
    )

    CHECKED: dict[str, ProtocolAdapter] = {
        "dcp-process": dcp_process,
        "dcp-staged": dcp_staged,
        "dcp-thread": dcp_thread,
        "deepspeed": deepspeed,
        "deepspeed-decoupled": deepspeed_decoupled,
        "impl": impl,
        "lightning": lightning,
        "mcore": mcore,
        "nvrx": nvrx,
        "olmo-core": olmo_core,
        "torch-checkpointing": torch_checkpointing,
        "torch-checkpointing-buffered": torch_checkpointing_buffered,
        "torchtitan": torchtitan,
    }
    MANAGERS: dict[str, ManagerAdapter] = {
        "impl": impl,
        "impl-local": impl_local,
        "nvrx": nvrx,
        "torchtitan": torchtitan,
        "lightning": lightning,
        "deepspeed": deepspeed,
        "deepspeed-decoupled": deepspeed_decoupled,
        "transformers": transformers,
    }
