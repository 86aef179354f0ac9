"""A new target or clause area needs no change inside the harness: both are discovered (issue 14); every clause
states its basis and severity (issue 30) and its symptom: what a user sees when a target breaks it, the "what goes
wrong" of a findings table (plain words, lowercase, no clause id, no trailing period).

Targets: the adapter modules of `ckptspec.spec.targets` (names not starting with `_`), entry points of the group
`ckptspec.targets`, and dotted paths. Clause areas: the files of `ckptspec/spec/clauses/`, in the order of its
`areas.toml`, unlisted ones after them by name.
"""

from __future__ import annotations

import re
import sys
from importlib import metadata

import pytest

from ckptspec.report import clauses
from ckptspec.spec.harness.surface import loading as targets


def test_builtin_targets_are_the_adapter_modules():
    names = (
        "impl",
        "impl_local",
        "mcore",
        "nvrx",
        "dcp_process",
        "dcp_staged",
        "dcp_thread",
        "lightning",
        "torchtitan",
        "deepspeed",
        "deepspeed_decoupled",
        "olmo_core",
        "transformers",
        "torch_checkpointing",
        "torch_checkpointing_buffered",
    )
    assert targets.builtin_targets() == {name.replace("_", "-"): f"ckptspec.spec.targets.{name}" for name in names}


def test_a_new_adapter_module_is_a_builtin_target(tmp_path, monkeypatch):
    package = tmp_path / "more_targets"
    package.mkdir()
    for name in ("__init__", "extra", "_private", "two_words"):
        (package / f"{name}.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(targets, "BUILTIN_PACKAGE", "more_targets")
    assert targets.builtin_targets() == {"extra": "more_targets.extra", "two-words": "more_targets.two_words"}
    sys.modules.pop("more_targets", None)


def test_entry_points_and_dotted_paths_name_targets(monkeypatch):
    point = metadata.EntryPoint(name="plugged", value="ckptspec.spec.targets.impl", group=targets.ENTRY_POINT_GROUP)
    real = metadata.entry_points
    monkeypatch.setattr(
        metadata, "entry_points", lambda **kw: [point] if kw.get("group") == targets.ENTRY_POINT_GROUP else real(**kw)
    )
    assert targets.known_targets()["plugged"] == "ckptspec.spec.targets.impl"
    assert targets.load_target("plugged").capabilities == targets.load_target("impl").capabilities
    assert targets.load_target("ckptspec.spec.targets.impl").adapter is targets.load_target("impl").adapter


def test_an_unknown_target_lists_the_known_ones():
    with pytest.raises(
        targets.TargetError,
        match="unknown target 'nope'; known targets: dcp-process, dcp-staged, dcp-thread, deepspeed, deepspeed-decoupled, "
        "impl, impl-local, lightning, mcore, nvrx, olmo-core, torch-checkpointing, torch-checkpointing-buffered, "
        "torchtitan, transformers, ",
    ):
        targets.load_target("nope")


def test_a_missing_package_names_the_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "megatron", None)
    monkeypatch.setattr(targets, "_loaded", {})
    with pytest.raises(targets.TargetUnavailable) as info:
        targets.load_target("mcore")
    assert str(info.value) == (
        "target 'mcore' needs megatron-core, which cannot be imported (No module named "
        '\'megatron\'); install it with: pip install "torch==2.13.0" -e ".[test,mcore]"'
    )
    assert isinstance(info.value, ImportError)  # benchmarks' peers catch ImportError to skip a missing target


def test_clause_areas_keep_the_table_order():
    assert clauses.AREAS == ("async_ckpt", "storage", "local", "integrity", "protocol", "manager", "faults")
    assert [path.name for path in clauses.FILES] == [f"{area}.toml" for area in clauses.AREAS]


def test_an_area_not_listed_comes_after_the_listed_ones(tmp_path):
    for name in ("b", "a", "z"):
        (tmp_path / f"{name}.toml").write_text("")
    (tmp_path / "areas.toml").write_text('areas = ["z", "b"]\n')
    assert [path.stem for path in clauses.discover(tmp_path)] == ["z", "b", "a"]
    (tmp_path / "areas.toml").unlink()
    assert [path.stem for path in clauses.discover(tmp_path)] == ["a", "b", "z"]


def test_a_listed_area_without_its_file_is_an_error(tmp_path):
    (tmp_path / "a.toml").write_text("")
    (tmp_path / "areas.toml").write_text('areas = ["a", "gone"]\n')
    with pytest.raises(clauses.ClauseError, match=r"no clause file for the listed area\(s\) gone in "):
        clauses.discover(tmp_path)


_CLAUSE = {
    "id": '"X-1"',
    "statement": '"s"',
    "symptom": '"a call waits forever"',
    "basis": '"documented"',
    "severity": '"hang"',
    "source": "\"002 AsyncCallsQueue.close: 'Finalize all calls upon closing.'\"",
}


def _area(tmp_path, **fields: str | None):
    entry = {**_CLAUSE, **fields}
    path = tmp_path / "area.toml"
    path.write_text("[[clause]]\n" + "".join(f"{k} = {v}\n" for k, v in entry.items() if v is not None))
    return path


def test_every_clause_states_its_basis_and_severity():
    registry = clauses.load()
    assert registry
    assert all(c["basis"] in clauses.BASES and c["severity"] in clauses.SEVERITIES for c in registry.values())
    assert all(c.get("decision", "").strip() for c in registry.values() if c["basis"] == "decision")


def test_every_clause_states_a_short_plain_symptom():
    registry = clauses.load()
    bad = {
        cid: c["symptom"]
        for cid, c in registry.items()
        if not c["symptom"][:1].islower()
        or c["symptom"].endswith(".")
        or len(c["symptom"].split()) > 15
        or re.search(r"\b[A-Z]+(-[A-Z0-9]+)*-\d+[A-Za-z]?\b", c["symptom"])
    }
    assert not bad, f"symptoms that are not short plain lowercase phrases without clause ids: {bad}"


def test_a_well_formed_clause_is_read_with_its_provenance(tmp_path):
    (entry,) = clauses.read_area(_area(tmp_path, basis='"decision"', decision='"why"', source='"torch DCP"'))
    assert (entry["basis"], entry["severity"], entry["decision"]) == ("decision", "hang", "why")


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"basis": None}, "clause 'X-1' lacks the required field.s. basis"),
        ({"severity": None}, "clause 'X-1' lacks the required field.s. severity"),
        ({"symptom": None}, "clause 'X-1' lacks the required field.s. symptom"),
        ({"symptom": '" "'}, "clause 'X-1' has no `symptom` text"),
        ({"symptom": "3"}, "clause 'X-1' has no `symptom` text"),
        ({"basis": '"folklore"'}, "clause 'X-1' has basis 'folklore'; it must be one of documented, implied, decision"),
        ({"severity": '"fatal"'}, "clause 'X-1' has severity 'fatal'; it must be one of data-loss, hang, leak, wrong"),
        ({"basis": '"decision"'}, "clause 'X-1' has basis 'decision' but no `decision` text"),
        ({"basis": '"decision"', "decision": '"  "'}, "clause 'X-1' has basis 'decision' but no `decision` text"),
        ({"level": '"x"'}, "clause 'X-1' has unknown field.s. level"),
    ],
)
def test_a_missing_or_bad_field_names_file_and_clause(tmp_path, fields, problem):
    path = _area(tmp_path, **fields)
    with pytest.raises(clauses.ClauseError, match=f"^{re.escape(str(path))}: {problem}"):
        clauses.read_area(path)
