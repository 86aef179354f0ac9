"""TAC-5: TorchAsyncCheckpoint.close(abort=True) waits for the save in flight, as a plain close() does.

NVRx 0.7.0 documents `TorchAsyncCheckpoint.close(abort=False)`: "abort (bool, optional) - Default to False. Needs to
be manually set to true when the checkpoint async process needs to be aborted." Its body calls the queue's
`close()` without passing `abort` (async_ckpt/torch_ckpt.py), so the queue finalizes: it waits for the write in
flight to end. Here the write is held (the state dict holds an object whose pickling waits for a file that this
script creates only after the verdict), and close(abort=True) is given 10 s to return.

    python TAC-5.py nvidia_resiliency_ext | impl
"""

import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import _common
import torch

torch_ckpt = _common.module("async_ckpt.torch_ckpt")
BOUND_S = 10  # the clause's bound on close(abort=True)
HELD_S = 120  # how long the held write waits for its gate before it gives up by itself


def _held(gate: str, reached: str) -> int:
    """Runs when the writer pickles the state dict: says so, then waits for the gate."""
    Path(reached).write_text(str(os.getpid()))
    deadline = time.monotonic() + HELD_S
    while not os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


class Held:
    """A state-dict value whose pickling, in the process that writes the checkpoint, waits for `gate`."""

    def __init__(self, gate: str, reached: str) -> None:
        self.gate, self.reached = gate, reached

    def __reduce__(self) -> tuple:
        return (int, (_held(self.gate, self.reached),))


def _body(rank: int, world: int, tmp: str) -> dict:
    gate, reached = os.path.join(tmp, "gate"), os.path.join(tmp, "reached")
    ckpt = torch_ckpt.TorchAsyncCheckpoint(persistent_queue=False)
    ckpt.async_save({"held": Held(gate, reached), "w": torch.ones(4)}, os.path.join(tmp, "ckpt.pt"))
    deadline = time.monotonic() + 60  # when the writer starts is not the subject
    while not os.path.exists(reached):
        if time.monotonic() > deadline:
            raise RuntimeError("the save's writer did not start within 60 s")
        time.sleep(0.05)
    closed = _common.outcome(BOUND_S, lambda: ckpt.close(abort=True))
    Path(gate).write_text("")  # let the held write go, so that a close that waited ends here
    for thread in threading.enumerate():
        if thread.daemon and thread is not threading.current_thread():
            thread.join(60)
    return {"close(abort=True) with the write held": closed}


def main() -> None:
    with _common.scratch() as tmp:
        how, value = _common.run_ranks(_body, tmp, world=1, timeout_s=BOUND_S + HELD_S + 30)[0]
    if how != "returned":
        _common.setup_failed({0: (how, value)})
    expected = {"close(abort=True) with the write held": "returned"}
    _common.verdict(value != expected, f"{value} (expected {expected}, within {BOUND_S} s)")


if __name__ == "__main__":
    main()
