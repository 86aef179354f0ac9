"""The configuration judged saves on this machine's local file system (P-DEFAULT-1).

Two ranks save, with a new saver as the adapter builds it (for a library's own target, its default configuration),
into a new directory below the test's temporary directory: each rank's tensors are of 1 byte, 4097 bytes and 1 MiB
plus 3 bytes, so that no file's size is a multiple of a disk block (what a writer with direct I/O must handle). The
save must commit and load exactly; a failure names the file system the directory is on.
"""

from __future__ import annotations

import os

import pytest
import torch

from ckptspec.spec.drivers.protocol_saves import assert_loads, committed, save
from ckptspec.spec.harness.ranks import run_on_ranks, world

pytestmark = pytest.mark.needs("protocol")
SIZES = {"one_byte": 1, "past_a_block": 4097, "past_a_mebibyte": (1 << 20) + 3}


def _state(rank: int) -> dict:
    """Rank `rank`'s state: a byte tensor of each size (values differ by rank), and a plain value."""
    tensors = {name: (torch.arange(size) % 251 + rank).to(torch.uint8) for name, size in SIZES.items()}
    return {f"r{rank}": {**tensors, "step": 1}}


def _save(path: str) -> None:
    save(_state(world()[0]), path)


def _file_system(path: str) -> str:
    """The type and mount point of the file system holding `path` (the longest mount point above it)."""
    best = ("unknown", "")
    with open("/proc/mounts") as mounts:
        for line in mounts:
            _, point, kind, *_ = line.split()
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best[1]):
                best = (kind, point)
    return f"{best[0]} (mounted at {best[1] or '?'})"


@pytest.mark.spec("P-DEFAULT-1")
def test_a_save_into_a_local_directory_commits_and_loads(tmp_path):
    path = str(tmp_path / "ckpt")
    where = _file_system(str(tmp_path)) if os.path.exists("/proc/mounts") else "this machine's file system"
    try:
        run_on_ranks(_save, 2, (path,), timeout=120)
    except Exception as error:
        error.add_note(f"the save of tensors of {sorted(SIZES.values())} bytes into {path}, on {where}, failed")
        raise
    whole = {**_state(0), **_state(1)}
    assert committed(path, 2), f"the save returned on every rank, but {path} on {where} is not committed"
    assert_loads(path, whole, f"a save into a new directory on {where}")
