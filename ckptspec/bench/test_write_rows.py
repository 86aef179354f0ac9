"""impl's write results travel as plain rows (ckptspec/impl/async_ckpt/filesystem_async.py `ResultRow`,
`retrieve_write_rows`, `results_of`): the file in which the worker leaves a save's results, and what the finalize
gathers from every rank, hold plain values only, no class to rebuild while unpickling (about 10x cheaper at 10,000
items), and the coordinator's objects rebuilt from them are the ones `.metadata` records. A writer that overrides
`retrieve_write_results` is still asked for its objects. The contract no spec clause states: the clauses it serves
(FS-18's files, IN-1's checksums, P-LOAD-1) judge the checkpoint end to end."""

from __future__ import annotations

import pickle
import pickletools
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from ckptspec.spec.harness import load_target
from ckptspec.spec.harness.surface.recipe import plan_async_save, recipe_modules

_IMPL = load_target("impl")
_MODULES = recipe_modules(_IMPL)
_WRITER = _IMPL.module("async_ckpt.filesystem_async").FileSystemWriterAsync
_CLASS_OPCODES = {"GLOBAL", "STACK_GLOBAL", "INST", "OBJ", "NEWOBJ", "NEWOBJ_EX", "REDUCE", "BUILD"}


def _state() -> dict[str, Any]:
    generator = torch.Generator().manual_seed(7)
    return {"model": {f"t{i}": torch.randn(i + 1, 3, generator=generator) for i in range(5)}, "step": 3}


def _save(state: dict[str, Any], path: str, writer: Any = None) -> None:
    plan_async_save(_MODULES, state, path, writer=writer).request().execute_sync()


def test_the_results_travel_as_plain_values_and_metadata_records_them(tmp_path, monkeypatch):
    files: list[bytes] = []
    rows: list[Any] = []
    asked_for_objects = []
    real_rows, real_results = _WRITER.retrieve_write_rows, _WRITER.retrieve_write_results

    def spy_rows(self: Any) -> Any:
        with open(self._results_path, "rb") as f:
            files.append(f.read())
        rows.append(real_rows(self))
        return rows[-1]

    def spy_results(self: Any) -> Any:
        asked_for_objects.append(self)
        return real_results(self)

    monkeypatch.setattr(_WRITER, "retrieve_write_rows", spy_rows)
    monkeypatch.setattr(_WRITER, "retrieve_write_results", spy_results)
    state, path = _state(), str(tmp_path / "c")
    _save(state, path)
    assert len(files) == 1, f"the finalize read the results {len(files)} times, not once as rows"
    assert not asked_for_objects, "the finalize asked impl's own writer for WriteResult objects, not rows"
    classes = {op.name for op, _, _ in pickletools.genops(files[0])} & _CLASS_OPCODES
    assert not classes, f"the worker's results file rebuilds objects while unpickling ({sorted(classes)})"
    with open(f"{path}/.metadata", "rb") as f:
        metadata = pickle.load(f)
    rebuilt = _IMPL.module("async_ckpt.filesystem_async").results_of(rows[0])
    assert {r.index: r.storage_data for r in rebuilt} == metadata.storage_data
    assert [r.index.index for r in rebuilt] == [row[2] for row in rows[0]]  # the hint, which index equality ignores
    loaded: dict[str, Any] = {"model": {k: torch.zeros_like(v) for k, v in state["model"].items()}, "step": 0}
    dcp.load(loaded, checkpoint_id=path)
    assert all(torch.equal(loaded["model"][k], v) for k, v in state["model"].items())
    assert loaded["step"] == 3


def test_a_writer_that_overrides_retrieve_write_results_is_asked_for_its_objects(tmp_path):
    class Counting(_WRITER):  # type: ignore[misc,valid-type]
        calls = 0

        def retrieve_write_results(self) -> Any:
            type(self).calls += 1
            return super().retrieve_write_results()

    path = str(tmp_path / "c")
    _save(_state(), path, writer=Counting(path))
    assert Counting.calls == 1
