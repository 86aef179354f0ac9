"""IN-6, the spec's decided part: a state dict whose part could never be loaded back is refused at save():
CheckpointingException on every rank, naming the class, and no checkpoint is committed.

This script shows a decision of this spec, not a broken promise of NVRx, and is not a bug report. IN-6's implied
part (the local checkpointing guide: "If these requirements are not met, a custom implementation of
`TensorAwareStateDict` is necessary", so a program's own module-level class saves and loads) passes on NVRx 0.4.1
and 0.7.0. Refusing what cannot load at save, rather than at load after a crash, is what IN-6's decision text
makes the spec's: no NVRx document promises it.

In NVRx 0.4.1 and 0.7.0, LocalCheckpointManager.save checks nothing: _save_fn runs torch.save on the part, so a
synchronous save of a state dict of a class defined inside a function fails with pickle's own error
(AttributeError "Can't pickle local object"), loudly, and commits nothing. (With the persistent queue the same
state dict hangs the blocking finalize: the unpicklable request is dropped by the queue's feeder thread; that is
charged to IN-6w and AQ-16, both decisions of this spec, and not shown here.) Synchronous save, no replication, 2
gloo ranks.

    python IN-6.py nvidia_resiliency_ext | impl
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common
import torch


class UserStateDict(_common.module("local.base_state_dict").TensorAwareStateDict):
    """A program's own state dict: named tensors; a popped tensor leaves its (shape, dtype) behind."""

    def __init__(self, values: dict):
        self.values_by_name, self.hollow = values, False

    @property
    def is_hollow(self):
        return self.hollow

    @property
    def tensors(self):
        return [v for v in self.values_by_name.values() if isinstance(v, torch.Tensor)]

    def pop_tensors(self):
        popped = self.tensors
        self.values_by_name = {k: (v.shape, v.dtype) for k, v in self.values_by_name.items()}
        self.hollow = True
        return popped

    def insert_tensors(self, tensor_data):
        self.values_by_name = dict(zip(self.values_by_name, tensor_data, strict=True))
        self.hollow = False

    def init_tensors(self):
        self.insert_tensors([torch.empty(shape, dtype=dtype) for shape, dtype in self.values_by_name.values()])

    def copy_tensors_to_cpu(self, non_blocking=False):
        self.values_by_name = {k: v.detach().to("cpu", copy=True) for k, v in self.values_by_name.items()}

    def restore_tensor_device(self, non_blocking=True):
        pass


def _body(rank: int, world: int, root: str) -> tuple:
    managers = _common.module("local.ckpt_managers.local_manager")

    class LocalStateDict(UserStateDict):
        """Defined inside a function: pickle cannot name it, so no program could ever load it."""

    try:
        managers.LocalCheckpointManager(f"{root}/node{rank}").save(LocalStateDict({"w": torch.ones(3)}), 1)
        raised = "nothing"
    except Exception as exc:  # catches all: the type and the message are what is judged
        raised = f"{type(exc).__name__}: {str(exc)[:100]}"
    return raised, managers.LocalCheckpointManager(f"{root}/node{rank}").find_latest()


def main() -> None:
    with _common.scratch() as root:
        results = _common.run_ranks(_body, root, timeout_s=60)
    if any(how != "returned" for how, _ in results.values()):
        _common.setup_failed(results)
    for rank, (_, (raised, latest)) in sorted(results.items()):
        print(f"rank {rank}: save() of a LocalStateDict raised {raised}; find_latest() afterwards: {latest}")
    refused = all(r.startswith("CheckpointingException") and "LocalStateDict" in r for _, (r, _) in results.values())
    committed = any(latest != -1 for _, (_, latest) in results.values())
    _common.verdict(
        not refused or committed,
        f"a state dict of a class defined inside a function: refused at save with CheckpointingException naming "
        f"the class on every rank: {refused}; a checkpoint committed: {committed}",
    )


if __name__ == "__main__":
    main()
