"""Bad input is refused with a clear error before anything is written (at FS-13's weak level FS-13w, a save into
a checkpoint directory may overwrite it, but whole)."""

import os
from typing import NamedTuple

import pytest
import torch
from torch.distributed.checkpoint import CheckpointException

from ckptspec.spec.drivers import saving
from ckptspec.spec.harness.asserts import assert_equal, attempt

pytestmark = pytest.mark.needs("storage_writer")


def _writer(path, **kwargs):
    return saving.module("filesystem_async").FileSystemWriterAsync(path, **kwargs)


def _plan_error(path):
    """The CheckpointException text from planning a save into `path` (fails the rank if planning succeeds)."""
    with pytest.raises(CheckpointException) as info:
        saving.plan({"w": torch.ones(2)}, _writer(path))
    return str(info.value)


@pytest.mark.spec("FS-12")
def test_a_path_that_is_a_file_is_refused_at_planning(rank_pool, tmp_path):
    path = tmp_path / "ckpt"
    path.write_bytes(b"not a checkpoint")
    message = rank_pool(1).run(_plan_error, str(path))[0]
    assert str(path) in message, f"the planning error does not name the path {path}: {message}"
    assert path.read_bytes() == b"not a checkpoint", (
        f"refusing the path changed it or wrote next to it: {sorted(os.listdir(tmp_path))}"
    )
    assert os.listdir(tmp_path) == ["ckpt"], (
        f"refusing the path changed it or wrote next to it: {sorted(os.listdir(tmp_path))}"
    )


class Trees(NamedTuple):
    before: dict  # relative name -> contents
    after: dict


def _resave(path):
    saving.async_save({"w": torch.arange(4.0)}, path, persistent=None, thread_count=2)
    before = saving.tree(path)
    with pytest.raises(CheckpointException):
        saving.plan({"w": torch.zeros(4), "extra": torch.ones(1)}, _writer(path, thread_count=2))
    return Trees(before, saving.tree(path))


@pytest.mark.spec("FS-13")
def test_a_directory_holding_a_checkpoint_is_refused_and_kept(rank_pool, tmp_path):
    path = str(tmp_path / "ckpt")
    trees = rank_pool(1).run(_resave, path)[0]
    assert trees.after == trees.before, (
        f"planning a save into a checkpoint directory changed it: files {sorted(trees.before)} "
        f"became {sorted(trees.after)} (or their contents changed)"
    )


OLD, NEW = {"w": torch.arange(4.0)}, {"w": torch.full((4,), 7.0), "extra": torch.ones(1)}


def _save_over(path) -> str | None:
    """Save NEW into a directory holding OLD: what FS-13w finds wrong with the directory afterwards, or None."""
    saving.async_save(OLD, path, persistent=None, thread_count=2)
    before = saving.tree(path)
    try:
        saving.async_save(NEW, path, persistent=None, thread_count=2)
    except CheckpointException:
        return None if saving.tree(path) == before else "a refused save into a checkpoint directory changed it"
    return saving.mismatch(saving.load(NEW, path), NEW, "dcp.load of a checkpoint directory saved over")


@pytest.mark.spec("FS-13w")
def test_a_save_over_a_checkpoint_is_refused_or_overwrites_it_whole(rank_pool, tmp_path):
    problem = rank_pool(1).run(_save_over, str(tmp_path / "ckpt"))[0]
    assert problem is None, problem


class Construction(NamedTuple):
    outcome: str  # of FileSystemWriterAsync(path, **kwargs): "returned", or the class name of what it raised
    created_path: bool


def _bad_arguments(path, kwargs):
    return Construction(attempt(_writer, path, **kwargs).text, os.path.exists(path))


@pytest.mark.spec("FS-14")
@pytest.mark.parametrize(
    "kwargs",
    [{"thread_count": 0}, {"thread_count": -1}, {"thread_count": 1, "separation_hint": "opt"}],
    ids=["thread_count=0", "thread_count=-1", "hint-with-one-thread"],
)
def test_bad_thread_counts_are_refused_at_construction(rank_pool, tmp_path, kwargs):
    path = str(tmp_path / "ckpt")
    assert_equal(
        "FileSystemWriterAsync",
        rank_pool(1).run(_bad_arguments, path, kwargs)[0],
        Construction(outcome="ValueError", created_path=False),
        call=f"FileSystemWriterAsync(path, **{kwargs})",
    )
