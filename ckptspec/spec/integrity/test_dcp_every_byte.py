"""IN-1, IN-2: damage at any byte of a committed FileSystemWriterAsync checkpoint is detected at load.

Not sampled: a small checkpoint is saved once, then each of its files in turn gets one bit flipped at each byte
(bit `position % 8`) and is cut at each length from 0 to its size less one, its saved bytes put back after each
damage. Every damage must make dcp.load with CachedMetadataFileSystemReader raise an error naming the file; the
intact checkpoint, loaded before the first damage and after the last, must return the saved state. The
checkpoints hold what a check of each loaded item misses: a data file whose only item is an empty tensor (a load
reads no byte of it: issue 45's example), an empty tensor after another item, non-tensor items (an int, a list
of a string and a bytes object) in nested dicts with an empty one, and .metadata; each has two data files.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from ckptspec.spec.drivers import saving
from ckptspec.spec.drivers.damage import files_under, names_file
from ckptspec.spec.harness.ranks import run_on_ranks, world

pytestmark = pytest.mark.needs("storage_writer", "temporal_caller")

MISSES_SHOWN = 5
"""A rank stops after this many missed damages: a reader without checksums misses most of them, and each miss may
load a damaged zip header that torch.load trusts."""


def _state(name: str) -> dict:
    """The state dict saved, with thread_count=2. empty-tensor-file: issue 45's example as load_damaged_checkpoint
    saves it, aa alone in the second data file; non-tensor-items: z after d.i in the first, d.n.v in the second."""
    if name == "empty-tensor-file":
        return {"anchor": torch.arange(4.0), "a": {}, "aa": torch.tensor([])}
    return {"d": {"i": 7, "n": {"v": ["text", b"\x00\xff"], "e": {}}}, "z": torch.empty(0, 3)}


def _damages(path: str, saved: bytes) -> Iterator[str]:
    """Damage the file at `path` (holding `saved`) in place, one way at a time; yields what it did before each put
    back. Writes only the bytes that change, so that a damage costs two small writes, not a copy of the file."""
    fd = os.open(path, os.O_RDWR)
    try:
        for at in range(len(saved)):
            os.pwrite(fd, bytes([saved[at] ^ (1 << at % 8)]), at)
            yield f"bit {at % 8} of byte {at} flipped"
            os.pwrite(fd, saved[at : at + 1], at)
        for length in range(len(saved)):
            os.truncate(fd, length)
            yield f"cut to {length} of {len(saved)} bytes"
            os.pwrite(fd, saved[length:], length)
    finally:
        os.close(fd)


def _message(exc: BaseException) -> str:
    """What `exc` says: for a CheckpointException, what the errors it gathered from the ranks say (its own str adds
    their tracebacks, which cost more to format than the rest of a failed load)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        return "\n".join(f"{type(error).__name__}: {error}" for error, _ in failures.values())
    return str(exc)


def _load(state: dict, base: str) -> object:
    reader = saving.module("cached_metadata_filesystem_reader").CachedMetadataFileSystemReader(base)
    return saving.load(state, base, reader)


def _intact(state: dict, base: str, when: str) -> list[str]:
    try:
        problem = saving.mismatch(_load(state, base), state, f"dcp.load of the intact checkpoint {when}")
    except BaseException as exc:
        problem = f"dcp.load of the intact checkpoint {when} raised {type(exc).__name__}: {_message(exc)[-300:]}"
    return [problem] if problem else []


def _damage_every_byte(base: str, name: str) -> tuple[int, list[str]]:
    """Save `name`'s state, then load it after each damage of each file: (damages tried, what went wrong)."""
    state = _state(name)
    saving.async_save(state, base, thread_count=2)
    problems = _intact(state, base, "before any damage")
    tried, missed = 0, 0
    for path in files_under(base):
        with open(path, "rb") as f:
            saved = f.read()
        file = os.path.basename(path)
        for damage in _damages(path, saved):
            tried += 1
            try:
                _load(state, base)
            except BaseException as exc:  # CheckpointException is a BaseException
                message = _message(exc)
                if names_file(message, file):
                    continue
                problems.append(f"{file}, {damage}: {type(exc).__name__} not naming it: {message[-200:]!r}")
            else:
                problems.append(f"{file}, {damage}: dcp.load returned without an error")
            missed += 1
            if missed == MISSES_SHOWN:
                return tried, problems
    return tried, problems + _intact(state, base, "after every damage was put back")


@pytest.mark.spec("IN-1", "IN-2")
@pytest.mark.parametrize("name", ["empty-tensor-file", "non-tensor-items"])
def test_damage_at_any_byte_of_any_file_is_detected_at_load(tmp_path, name):
    tried, problems = run_on_ranks(_damage_every_byte, 1, (str(tmp_path / "c"), name), timeout=300)[0]
    assert not problems, (
        f"each byte of each file of a committed checkpoint ({name}) damaged in turn, then loaded with "
        f"CachedMetadataFileSystemReader: of {tried} damages, the first {MISSES_SHOWN} at most that were not "
        f"reported as an error naming the file, and any intact load that failed: {problems}"
    )


def _collective_loads_of_damaged_unread_files(base: str) -> list[str]:
    """On every rank: save a shared tensor and an empty tensor of the rank's own, then for each data file in turn
    flip a bit of its last byte (in its last item: an empty tensor, which no rank's load plan reads) and load with
    one collective dcp.load; what each load did on this rank."""
    rank, _ = world()
    state = {"anchor": torch.arange(4.0), f"rank{rank}": {"empty": torch.empty(0, rank + 1)}}
    saving.async_save(state, base)
    outcomes = []
    for name in saving.data_files(base):
        path = os.path.join(base, name)
        with open(path, "rb") as f:
            saved = f.read()
        if rank == 0:
            with open(path, "wb") as f:
                f.write(saved[:-1] + bytes([saved[-1] ^ 1]))
        dist.barrier()
        reader = saving.module("cached_metadata_filesystem_reader").CachedMetadataFileSystemReader(base)
        try:
            dcp.load(saving.template(state), storage_reader=reader)
            outcomes.append(f"{name}: returned without an error")
        except BaseException as exc:  # CheckpointException is a BaseException
            message = _message(exc)
            named = names_file(message, name)
            outcomes.append(f"{name}: detected" if named else f"{name}: not named in {message[-200:]!r}")
        dist.barrier()
        if rank == 0:
            with open(path, "wb") as f:
                f.write(saved)
    return outcomes


@pytest.mark.spec("IN-2")
def test_a_collective_load_reports_damage_that_no_rank_loads_on_every_rank(tmp_path):
    """Each rank's empty tensor is the last item of the rank's data file, and no load reads it: damage there must
    still make the load raise on every rank."""
    results = run_on_ranks(_collective_loads_of_damaged_unread_files, 2, (str(tmp_path / "c"),), timeout=120)
    detected = [f"{line.split(':')[0]}: detected" for line in results[0]]
    message = (
        "the last byte of each data file in turn (each ending with a rank's empty tensor) flipped, then one "
        f"collective dcp.load with CachedMetadataFileSystemReader on 2 ranks: per rank {results}; every rank should "
        "raise an error naming the damaged file"
    )
    assert len(detected) == 2, message
    assert results == [detected, detected], message
