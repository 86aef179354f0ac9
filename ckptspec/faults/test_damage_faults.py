"""Damage after commit and planted pickles: the fault matrix rows of issue 21 (clauses FI-TRUNCATE/BITFLIP/SWAP/
DELETE-1, FI-PICKLE-1; the properties are ckptspec/spec/integrity's IN-2 to IN-4).

One damage per case, in the "committed" phase (the checkpoint was saved successfully and is damaged at rest):
a FileSystemWriterAsync data file or its .metadata (loaded with CachedMetadataFileSystemReader, which must
raise naming the file), a local part without replication (never loaded), or every file of one node with
replication (every part still has an intact replica on the other node, so the load is exact).
"""

from __future__ import annotations

import pytest
import torch

from ckptspec.spec.drivers.damage import Damage, load_damaged_checkpoint, load_damaged_local, plant_then_load
from ckptspec.spec.drivers.faults.tmpdirs import on_ranks
from ckptspec.spec.drivers.local import rank_value
from ckptspec.spec.harness import assert_each_rank, assert_state_dict_equal, world

CLAUSES = {"truncate": "FI-TRUNCATE-1", "flip": "FI-BITFLIP-1", "swap": "FI-SWAP-1", "delete": "FI-DELETE-1"}
NEEDS = {
    "data": ("storage_writer", "temporal_caller"),
    "metadata": ("storage_writer", "temporal_caller"),
    "part": ("local_checkpointing",),
    "replica": ("local_checkpointing",),
}
STATE = {"w": torch.arange(64.0), "h": torch.ones(8, dtype=torch.bfloat16), "step": 3}


def _cases():
    for kind, clause in CLAUSES.items():
        for where, needs in NEEDS.items():
            marks = [pytest.mark.spec(clause, "IN-2" if where in ("data", "metadata") else "IN-3")]
            yield pytest.param(kind, where, marks=[*marks, pytest.mark.needs(*needs)], id=f"committed-{kind}-{where}")


def _summary(found) -> tuple:
    """(find_latest, load outcome, None or how the loaded state differs): no tensors cross back from a fresh
    rank, which exits right after answering."""
    if found is None:
        return (None, "nothing damaged", None)
    problem = None
    if found.state_dict is not None:
        try:
            assert_state_dict_equal(found.state_dict, rank_value(world()[0], 1), call="load()")
        except AssertionError as exc:
            problem = str(exc)
    return (found.latest, found.load, problem)


def _local(base, layout, damage, from_rank, every_file):
    _damaged, found = load_damaged_local(base, layout, damage, 0, from_rank, every_file)
    return _summary(found)


def _planted(base, layout):
    ran, found = plant_then_load(base, layout)
    return ran, _summary(found)


def _check_local(results: list[tuple], replicated: bool, what: str) -> None:
    if replicated:
        assert results == [(1, "returned", None)] * 2, (
            f"{what}: per rank (find_latest, load, mismatch) {results}, but every rank should load iteration 1 "
            "exactly from the intact replicas"
        )
    else:
        assert all(r[1] == "CheckpointingException" for r in results), (
            f"{what}: per rank (find_latest, load, mismatch) {results}, but the damaged iteration should never "
            "load (find_latest() -1, or load() CheckpointingException on every rank)"
        )


@pytest.mark.parametrize(("kind", "where"), list(_cases()))
def test_damage_after_commit(tmp_path, kind, where):
    damage = Damage(kind, file=0, where=0.5, bit=3)
    base = str(tmp_path / "case")
    if where in ("data", "metadata"):
        results = on_ranks(2, load_damaged_checkpoint, base, STATE, damage, where)
        assert results == ["detected", "detected"], (
            f"{kind} of the {where} file of a committed checkpoint, loaded with CachedMetadataFileSystemReader: "
            f"per rank {results}, but every rank should raise an error naming the file"
        )
        return
    replicated = where == "replica"
    # A swap copies in another rank's part, or for a node holding replicas another iteration's parts (the other
    # node's files have the same names and bytes).
    results = on_ranks(2, _local, base, (1, 2) if replicated else None, damage, not replicated, replicated)
    _check_local(results, replicated, f"{kind} of {'every file' if replicated else 'the part'} on rank 0's storage")


@pytest.mark.spec("FI-PICKLE-1", "IN-4")
@pytest.mark.needs("local_checkpointing")
@pytest.mark.parametrize(
    "layout", [pytest.param(None, id="committed-part"), pytest.param((1, 2), id="committed-replica")]
)
def test_planted_pickle(tmp_path, layout):
    results = on_ranks(2, _planted, str(tmp_path / "case"), layout)
    assert_each_rank("code ran", [r[0] for r in results], False, call="loading after rank 0's files were planted")
    _check_local([r[1] for r in results], layout is not None, "every file of rank 0's storage planted")
