"""Damage after commit, chosen by hypothesis and applied to files the tests find by listing (target-neutral).

A `Damage` names a kind (truncate, flip a bit, swap in another checkpoint's file, delete), which file of a
sorted listing, and where in it. `apply` reports the path it changed, or None when the choice changes nothing
(an empty file to truncate, a swap with identical bytes), which the tests discard.

The rank functions `load_damaged_checkpoint` (FileSystemWriterAsync) and `load_damaged_local` (local checkpoint
manager) save, damage and load; the spec tests (hypothesis choosing the damage) and the fault suite (one damage
per row of its matrix) both drive them.

`names_file` is IN-2's test of "naming the damaged file", as the installed torch lets a reader name it: torch 2.11's
dcp.load (2.12's not read) catches what the reader's `read_metadata` raises, logs it and raises
`AssertionError("metadata is None")` in its place, so no reader can name a damaged .metadata through it; 2.13 and
later add the reader's error to that text ("metadata is None; global metadata read failed: ..."). `metadata_error_text`
asks the installed torch which it does, by a load whose reader cannot read its metadata, rather than by its version.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import re
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from hypothesis import strategies as st

from ckptspec.spec.drivers import saving
from ckptspec.spec.drivers.local import Found, find_then_load, manager, node_root, rank_value, save, tasd
from ckptspec.spec.harness import strategies
from ckptspec.spec.harness.asserts import attempt
from ckptspec.spec.harness.processes import remove
from ckptspec.spec.harness.ranks import world

__all__ = [
    "KINDS",
    "Damage",
    "Planted",
    "apply",
    "damages",
    "files_under",
    "load_damaged_checkpoint",
    "load_damaged_local",
    "plant_then_load",
]

KINDS = ("truncate", "flip", "swap", "delete")


@dataclass(frozen=True)
class Damage:
    kind: str
    file: int  # index into the listing, modulo its length
    where: float  # in [0, 1): the truncation point or the byte to flip, as a fraction of the file's size
    bit: int  # 0..7, the bit to flip
    source: int = 0  # swap: index into the other checkpoint's files, when none has the same name

    def describe(self, path: str) -> str:
        return f"{self.kind} of {os.path.basename(path)} (at {self.where:.3f}, bit {self.bit})"


def damages(kinds: Sequence[str] = KINDS) -> st.SearchStrategy[Damage]:
    return st.builds(
        Damage,
        kind=st.sampled_from(kinds),
        file=st.integers(0, 63),
        where=st.floats(0, 1, exclude_max=True, allow_nan=False),
        bit=st.integers(0, 7),
        source=st.integers(0, 63),
    )


def files_under(root: str) -> list[str]:
    """Every file under root, sorted (hidden ones included)."""
    return sorted(os.path.join(d, f) for d, _, names in os.walk(root) for f in names)


def apply(damage: Damage, files: list[str], others: list[str]) -> str | None:
    """Damage one of `files` (a swap copies in one of `others`); the path changed, or None if nothing changed."""
    if not files:
        return None
    path = files[damage.file % len(files)]
    with open(path, "rb") as f:
        data = f.read()
    if damage.kind == "delete":
        os.remove(path)
        return path
    if damage.kind == "swap":
        same_name = [o for o in others if os.path.basename(o) == os.path.basename(path)]
        pool = same_name or others
        if not pool:
            return None
        with open(pool[damage.source % len(pool)], "rb") as f:
            new = f.read()
    elif not data:
        return None
    elif damage.kind == "truncate":
        new = data[: int(damage.where * len(data))]
    else:
        pos = int(damage.where * len(data))
        new = data[:pos] + bytes([data[pos] ^ (1 << damage.bit)]) + data[pos + 1 :]
    if new == data:
        return None
    with open(path, "wb") as f:
        f.write(new)
    return path


class _MetadataProbeError(OSError):
    """What the probe's reader raises for its metadata."""


@functools.cache
def metadata_error_text() -> str | None:
    """What the installed torch's dcp.load raises in place of the reader's error when `read_metadata` raises, or None
    when that error reaches the caller (its text is in what dcp.load raises)."""
    marker = "ckptspec-probe: the metadata cannot be read"

    class Unreadable(dcp.FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            raise _MetadataProbeError(marker)

    with (
        tempfile.TemporaryDirectory(prefix="ckptspec-probe-") as tmp,
        warnings.catch_warnings(),
        _filtered(logging.getLogger(), _WithoutProbe()),  # torch's dcp.load logs to the root logger
    ):
        warnings.simplefilter("ignore")  # "torch.distributed is disabled ...: load in a single process"
        try:
            dcp.load({}, storage_reader=Unreadable(tmp), no_dist=True)
        except (KeyboardInterrupt, SystemExit):
            raise
        except BaseException as exc:  # CheckpointException is a BaseException
            text = failure_text(exc)
            return None if marker in text else text
    raise AssertionError("dcp.load returned although its reader could not read the metadata")


class _WithoutProbe(logging.Filter):
    """Drops the records of the probe's own error (torch 2.13 logs each failed read with its traceback)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], _MetadataProbeError))


@contextlib.contextmanager
def _filtered(log: logging.Logger, log_filter: logging.Filter) -> Iterator[None]:
    log.addFilter(log_filter)
    try:
        yield
    finally:
        log.removeFilter(log_filter)


def failure_text(exc: BaseException) -> str:
    """What `exc` says: for a CheckpointException, "Type: message" of each error it gathered from the ranks (its own
    str adds their tracebacks)."""
    failures = getattr(exc, "failures", None)
    if isinstance(failures, dict):
        return "\n".join(f"{type(error).__name__}: {error}" for error, _ in failures.values())
    return f"{type(exc).__name__}: {exc}"


def names_file(message: str, file: str) -> bool:
    """Whether `message` (an error of dcp.load) names `file` (a file name, or a path ending with it), as far as the
    installed torch lets a reader name it: a damaged .metadata is named by torch's own text where torch puts that text
    in place of the reader's error (`metadata_error_text`). ".metadata" inside "__0.metadata", the rank-local metadata
    that torch looks for when .metadata cannot be read, does not count."""
    return re.search(rf"(?<![\w.]){re.escape(file)}(?!\w)", message) is not None or torch_replaced_it(message, file)


def torch_replaced_it(message: str, file: str) -> bool:
    """Whether `file` is .metadata and `message` holds the text the installed torch raises in place of the reader's
    error (`metadata_error_text`), the only way a damaged .metadata can be named there."""
    replaced = metadata_error_text() if file == ".metadata" else None
    return replaced is not None and replaced in message


def _pick(files: list[str], which: str) -> list[str]:
    """`which`: "any" (all files), "metadata" (.metadata only), "data" (every other file)."""
    if which == "metadata":
        return [f for f in files if os.path.basename(f) == ".metadata"]
    if which == "data":
        return [f for f in files if os.path.basename(f) != ".metadata"]
    return files


def _share(value: Any, src: int) -> Any:
    box = [value]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def load_damaged_checkpoint(base: str, state_dict: dict[str, Any], damage: Damage, which: str = "any") -> str | None:
    """On every rank: save, save a changed copy (the source of swaps), damage the first checkpoint on rank 0,
    load it with the target's CachedMetadataFileSystemReader.

    "detected" when the load raised naming the damaged file; None when the damage changed nothing; else what
    went wrong.
    """
    rank, _ = world()
    state = {"anchor": torch.arange(4.0), **strategies.private_copy(state_dict)}
    good, other = os.path.join(base, "good"), os.path.join(base, "other")
    saving.async_save(state, good, thread_count=2)
    changed = strategies.private_copy(state)
    strategies.mutate_in_place(changed)
    saving.async_save(changed, other, thread_count=2)
    damaged = apply(damage, _pick(files_under(good), which), files_under(other)) if rank == 0 else None
    damaged = _share(damaged, 0)
    if damaged is None:
        return None
    reader = saving.module("cached_metadata_filesystem_reader").CachedMetadataFileSystemReader(good)
    outcome = attempt(saving.load, state, good, reader, bound=saving.FINALIZE_BOUND, what="dcp.load", hung_fails=True)
    dist.barrier()
    if rank == 0:
        remove(base)
    name = os.path.basename(damaged)
    if outcome.returned:
        problem = saving.mismatch(outcome.value, state, "dcp.load")
        return f"dcp.load returned {'damaged data' if problem else 'the data'} without an error"
    if name not in outcome.message and not torch_replaced_it(outcome.message, name):
        return f"dcp.load raised {outcome.text}, but its message does not name {name}: {outcome.message[:300]}"
    return "detected"


def load_damaged_local(
    base: str, layout: tuple[int, int] | None, damage: Damage, holder: int, from_rank: bool, every_file: bool = False
) -> tuple[str | None, Found | None]:
    """On every rank: save iteration 1 (and 2 under another root, the source of another iteration's parts),
    damage one file (or `every_file`) of rank `holder`'s storage, then find_latest and load with fresh managers.

    A swap copies in another rank's file (`from_rank`) or another iteration's. Returns (the damaged path or
    None, the rank's Found or None).
    """
    rank, world_size = world()
    here, other = os.path.join(base, "ckpt"), os.path.join(base, "other")
    save(manager(here, layout), tasd(rank_value(rank, 1)), 1)
    save(manager(other, layout), tasd(rank_value(rank, 2)), 2)
    dist.barrier()
    damaged = None
    if rank == holder:
        source = node_root(here, (rank + 1) % world_size) if from_rank else node_root(other, rank)
        files = files_under(node_root(here, rank))
        for n in range(len(files) if every_file else 1):
            hit = apply(Damage(damage.kind, damage.file + n, damage.where, damage.bit), files, files_under(source))
            damaged = damaged or hit
    damaged = _share(damaged, holder)
    found = find_then_load(manager(here, layout)) if damaged is not None else None
    dist.barrier()
    if rank == 0:
        remove(base)
    return damaged, found


class Planted:
    """Unpickling this creates the directory `marker`: the observable stand-in for arbitrary code."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.mkdir, (self.marker,))


def plant_then_load(base: str, layout: tuple[int, int] | None) -> tuple[bool, Found]:
    """On every rank: save iteration 1, replace every file of rank 0's storage by a planted pickle (a valid
    torch.save file), then find_latest and load with fresh managers. Returns (whether the code ran, Found)."""
    rank, _ = world()
    marker = os.path.join(base, "code-ran")
    save(manager(base, layout), tasd(rank_value(rank, 1)), 1)
    dist.barrier()
    if rank == 0:
        for path in files_under(node_root(base, 0)):
            torch.save({"state": Planted(marker)}, path)
    dist.barrier()
    found = find_then_load(manager(base, layout))
    dist.barrier()
    return os.path.exists(marker), found
