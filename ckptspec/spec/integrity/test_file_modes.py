"""IN-5: what a save creates honours the umask and is never group- or world-writable."""

from __future__ import annotations

import os
import stat
import uuid

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ckptspec.spec.drivers import saving
from ckptspec.spec.drivers.local import manager, rank_value, save, tasd
from ckptspec.spec.harness.processes import remove

UMASKS = (0o000, 0o002, 0o007, 0o022, 0o027, 0o077)


def _modes(root: str) -> dict[str, int]:
    out = {root: stat.S_IMODE(os.stat(root).st_mode)}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            out[path] = stat.S_IMODE(os.lstat(path).st_mode)
    return out


def _violations(modes: dict[str, int], umask: int, base: str) -> list[str]:
    return [
        f"{os.path.relpath(path, base)} has mode {oct(mode)}"
        for path, mode in sorted(modes.items())
        if mode & 0o022 or mode & umask
    ]


def _save_under(base: str, umask: int, what: str) -> list[str]:
    old = os.umask(umask)
    try:
        if what == "dcp":
            path = os.path.join(base, "a", "b", "ckpt")  # the writer creates the missing parents too
            saving.async_save({"w": torch.arange(4.0), "n": 3}, path, persistent=None)
        else:
            save(manager(base), tasd(rank_value(0, 1)), 1)
    finally:
        os.umask(old)
    found = _violations(_modes(base), umask, base)  # base did not exist: the save created all of it
    remove(base)
    return found


@pytest.mark.spec("IN-5")
@pytest.mark.parametrize(
    "what",
    [
        pytest.param("dcp", marks=pytest.mark.needs("storage_writer")),
        pytest.param("local", marks=pytest.mark.needs("local_checkpointing")),
    ],
)
@given(umask=st.sampled_from(UMASKS))
def test_created_files_honour_the_umask_and_are_never_group_or_world_writable(rank_pool, tmp_path_factory, what, umask):
    base = os.path.join(str(tmp_path_factory.mktemp("modes")), uuid.uuid4().hex)
    found = rank_pool(1).run(_save_under, base, umask, what)[0]
    assert not found, (
        f"a {what} save under umask {oct(umask)} created {'; '.join(found)}: every mode must have the umask's bits "
        "and group/other write cleared"
    )
