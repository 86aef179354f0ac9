"""TAC-2: finalize_async_save(blocking=False) in a training loop never waits and eventually finalizes every save.

Judged with CPU tensors. Documented: the TorchAsyncCheckpoint guide shows "how the routine can be used to
synchronize the asynchronous checkpoint in a non-blocking / blocking manner", with a training loop that calls
finalize_async_save(blocking=False) every iteration and updates the model in place between saves.

In NVRx 0.4.1 and 0.7.0 alike, async_save stages the state dict with utils.preload_tensors, whose `tensor.to("cpu")` returns a
CPU tensor itself rather than a copy. The persistent caller then puts the request on a torch.multiprocessing
queue, which moves that tensor's storage into shared memory and hands the worker the same memory, so the
worker's torch.save writes whatever the trainer holds when the write actually runs. Here each write is held (a
value whose pickling waits for a file) until the loop's next in-place update; the files hold the later steps.

    python TAC-2.py nvidia_resiliency_ext | impl
"""

import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common  # noqa: E402
import torch  # noqa: E402

# At import, so that the persistent worker (which re-imports this script) gets the CPU stand-in too.
TAC = _common.module("async_ckpt.torch_ckpt")


class Gate:
    """A value whose pickling waits (at most 30 s) for file `path`, except in the process that created it."""

    def __init__(self, path: str, creator: int | None = None):
        self.path, self.creator = path, os.getpid() if creator is None else creator

    def __reduce__(self):
        deadline = time.monotonic() + 30
        while os.getpid() != self.creator and not os.path.exists(self.path) and time.monotonic() < deadline:
            time.sleep(0.01)
        return (Gate, (self.path, self.creator))


def _loop(rank: int, world: int, tmp: str) -> tuple[float, dict]:
    ckpt = TAC.TorchAsyncCheckpoint(persistent_queue=True)
    w, saved, longest = torch.zeros(4), {}, 0.0  # CPU tensors: the trainer's model
    for step in range(4):
        start = time.monotonic()
        ckpt.finalize_async_save(blocking=False)
        longest = max(longest, time.monotonic() - start)
        w.add_(1)  # the training step, in place
        if step % 2 == 0:
            path = os.path.join(tmp, f"step{step}.pt")
            ckpt.async_save({"gate": Gate(os.path.join(tmp, f"gate{step}")), "w": w, "step": step}, path)
            saved[path] = w.tolist()
        else:
            Path(tmp, f"gate{step - 1}").touch()  # the previous save's write may go on now
    Path(tmp, "gate2").touch()
    ckpt.finalize_async_save(blocking=True, terminate=True)
    written = {p: torch.load(p, weights_only=False) for p in saved}
    return longest, {os.path.basename(p): (saved[p], written[p]["w"].tolist()) for p in saved}


def main() -> None:
    with _common.scratch() as tmp:
        results = _common.run_ranks(_loop, tmp, world=1, timeout_s=40)
    how, value = results[0]
    if how != "returned":
        _common.verdict(True, f"the training loop with CPU tensors did not complete: {how}: {value}")
    longest, files = value
    wrong = {name: f"w at async_save {want}, loaded back {got}" for name, (want, got) in files.items() if want != got}
    for name, (want, got) in files.items():
        print(f"{name}: w at async_save {want}, loaded back from disk {got}")
    _common.verdict(
        bool(wrong) or longest > 5,
        f"CPU tensors; longest finalize_async_save(blocking=False) {longest:.2f} s; "
        + (f"files holding values of later steps: {wrong}" if wrong else "every file holds its step's values"),
    )


if __name__ == "__main__":
    main()
