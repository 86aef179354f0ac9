"""Whether ranks forked from a process that imported some modules can still use CUDA.

The ranks are forked from a forkserver. Preloading the target in that server saves every rank its own import of
the target (impl, DCP, a release: 1 to 3 s per rank on a GPU node, where the CUDA build of torch is larger), but
a module whose import initialises CUDA would leave every forked rank unable to use it ("Cannot re-initialize
CUDA in forked subprocess"; Megatron-Core's import did, on an H200). `cuda_survives_fork(modules)` answers by
trying: a fresh interpreter imports the modules, forks, and the child puts a tensor on the GPU. Without a GPU
the answer is yes at no cost (nothing to initialise). One probe per process and module list; a probe that fails
or exceeds its bound answers no (the safe choice: the ranks then import the target themselves).
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys

__all__ = ["PROBE_BOUND_S", "cuda_survives_fork", "forked_child_can_use"]

PROBE_BOUND_S = 120.0  # an interpreter start and a CUDA initialisation on a loaded GPU node, with room to spare
_PROBE = """
import importlib, os, sys
import torch
device, names = sys.argv[1], sys.argv[2:]
for name in names:
    importlib.import_module(name)
pid = os.fork()
if pid == 0:
    try:
        torch.zeros(1, device=device).add_(1).cpu()
    except BaseException:
        os._exit(1)
    os._exit(0)
_, status = os.waitpid(pid, 0)
print("survives" if os.waitstatus_to_exitcode(status) == 0 else "broken")
"""


@functools.cache
def cuda_survives_fork(modules: tuple[str, ...]) -> bool:
    """True when a process forked after importing `modules` can use CUDA (always, on a machine without a GPU)."""
    import torch

    if torch.cuda.device_count() == 0:  # device_count() does not initialise CUDA
        return True
    return forked_child_can_use("cuda", modules)


def forked_child_can_use(device: str, modules: tuple[str, ...]) -> bool:
    """The probe itself: a fresh interpreter imports `modules` (with this process's sys.path), forks, and the
    child computes on `device`. False when any step fails or the probe exceeds PROBE_BOUND_S."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE, device, *modules],
            capture_output=True,
            text=True,
            timeout=PROBE_BOUND_S,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return False
    return done.returncode == 0 and done.stdout.strip().endswith("survives")
