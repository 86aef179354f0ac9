"""FI-STORAGE-2 on pytorch-lightning 2.6.6: after one failed save, AsyncCheckpointIO fails every later one.

    python findings/repro/lightning-2.6.6/FI-STORAGE-2.py pytorch_lightning

Clause (implied, data-loss): after a storage error the next save on the same saver succeeds. Source: Lightning's
own comment in AsyncCheckpointIO.save_checkpoint ("if an error was raised between the previous time
`save_checkpoint` was called and now, because `executor.submit` is not blocking"): the error reported is meant to
be that of the saves since the last call.

Mechanism (pytorch_lightning/plugins/io/async_plugin.py): the worker stores a failure in `self._error`, which
nothing ever clears. Every later `save_checkpoint()` submits its save and then raises that old error, and every
`teardown()` raises it too, although the later save itself succeeds (its file appears): the caller is told a good
save failed, and cannot tell which save an error belongs to.

One process, no process group, no teardown() between saves (2.5.3 cannot save after one, #20952): save 0's
directory cannot be created (its parent is a file); saves 1 to 3 go to a good directory, each waited for by its
file appearing. Lightning may report save 0's error once, at the next call; reporting it again is the break. Prints
what it saw; exits 1 where the clause is broken, 0 where it holds, 2 when it could not run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time

import torch


def _written(path: str, bound: float = 30.0) -> bool:
    """Whether the file appears within `bound` seconds (the executor's one thread runs saves in order)."""
    deadline = time.monotonic() + bound
    while not os.path.isfile(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.isfile(path)


def main() -> int:
    if sys.argv[1:] != ["pytorch_lightning"]:
        print(f"usage: {sys.argv[0]} pytorch_lightning", file=sys.stderr)
        return 2
    from pytorch_lightning.plugins.io import AsyncCheckpointIO, TorchCheckpointIO

    tmp = tempfile.mkdtemp(prefix="repro-lightning-")
    io = AsyncCheckpointIO(TorchCheckpointIO())
    try:
        blocker = os.path.join(tmp, "a-file")
        with open(blocker, "w") as f:
            f.write("not a directory")
        saves = [os.path.join(blocker, "0.ckpt")] + [os.path.join(tmp, "good", f"{i}.ckpt") for i in (1, 2, 3)]
        raised = []
        for i, path in enumerate(saves):  # save 0 cannot create its directory; saves 1 to 3 can
            try:
                io.save_checkpoint({"w": torch.full((4,), float(i))}, path)
                raised.append(None)
            except Exception as exc:
                raised.append(f"{type(exc).__name__}: {exc}")
            if i and not _written(path):
                print(f"save {i} to a good directory wrote nothing within 30 s: cannot reproduce")
                return 2
            print(f"save_checkpoint #{i}: {raised[-1] or 'returned'}")
        # Save 0's error may be reported once, by the first call after it happened; a later call reporting it again
        # tells the caller that a save failed whose file is there.
        first = next((i for i, r in enumerate(raised) if r), None)
        again = [i for i, r in enumerate(raised) if r and first is not None and i > first]
        if again:
            print(f"BROKEN: calls {again} raised save 0's error again, although saves 1 to 3 all wrote their files")
            return 1
        print("HOLDS: save 0's error was reported at most once")
        return 0
    finally:
        with contextlib.suppress(Exception):
            io.teardown()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
