"""CL-3: replicate() gives each clique member every member's part, equal to what that member passed (views too).

Shown on NVRx 0.4.1 and 0.7.0 (same replication code). CliqueReplicationStrategy.replicate: "Replicates the local
checkpoint and returns the replicated checkpoints with IDs", it "gathers replicated copies from other ranks, and
reconstructs the state dictionaries".

Configuration that shows it: a gloo process group and CPU tensors, 2 ranks, one clique (replication factor 2).
replicate() pops the tensors and calls GroupWrapper.all_gather_batch (strategies.py:119), which broadcasts each
tensor from its owner as it is, into a fresh contiguous tensor of the same shape on every other rank
(group_utils.py:360-373: `ten = my_tensors[i]` on the owner, `tp.empty_like()` elsewhere, then
`self.broadcast(ten, src=...)`). Over gloo a non-contiguous view is sent as the memory it starts at: a [:, ::2]
view holding [100, 102, ...] arrives as [100, 101, ...]; an expanded view arrives as the elements after its one
stored element. The local checkpoint's BasicTensorAwareStateDict takes CUDA tensors; this script's own
TensorAwareStateDict holds CPU tensors so that gloo runs the broadcast. What NCCL does with a non-contiguous CUDA
tensor in this broadcast was not run (no GPU): this report claims nothing about it.

    python CL-3.py nvidia_resiliency_ext | impl
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common
import torch


def _views(rank: int) -> dict:
    base = (torch.arange(12.0) + 100 * rank).reshape(3, 4)
    return {"strided": base[:, ::2], "transposed": base.t(), "row": base[1], "expanded": base[2, 1:2].expand(5)}


def _body(rank: int, world: int) -> dict:
    strategies = _common.module("local.replication.strategies")
    _common.module("local.ckpt_managers.local_manager")  # the CPU stand-in for the replica receiver too
    _common.cpu_replica_transfers()
    strategy = strategies.CliqueReplicationStrategy.from_replication_params(1, 2)
    parts, ids = strategy.replicate(_common.CpuStateDict(_views(rank)), ("part", rank))
    wrong = {}
    for part, part_id in zip(parts, ids, strict=True):
        for key, want in _views(part_id[1]).items():
            got = part.state[key]
            if not torch.equal(got, want):
                wrong[f"part of rank {part_id[1]}, {key!r}"] = (
                    f"{got.flatten().tolist()} (sent {want.flatten().tolist()})"
                )
    return {"ids": [part_id[1] for part_id in ids], "wrong": wrong}


def main() -> None:
    results = _common.run_ranks(_body, timeout_s=120)
    if any(how != "returned" for how, _ in results.values()):
        _common.setup_failed(results)
    wrong = {}
    for rank, (_, got) in results.items():
        print(f"rank {rank}: parts of ranks {got['ids']}")
        wrong.update({f"rank {rank}, {what}": value for what, value in got["wrong"].items()})
    for what, value in wrong.items():
        print(f"  {what}: {value}")
    _common.verdict(bool(wrong), f"{len(wrong)} replicated views differ from what their member passed")


if __name__ == "__main__":
    main()
