"""The conformance report: Markdown table, --update, input validation, --run (the words: test_verdicts.py)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from ckptspec.report import clauses as clause_registry
from ckptspec.report import report, runs
from ckptspec.report.blocks import END_MARKER, START_MARKER, replace_block
from ckptspec.report.report import main, render
from ckptspec.report.runs import ReportError, load_run, stored_runs

REGISTRY = {
    "X-1": {"statement": "first clause", "source": "s", "basis": "documented", "severity": "hang"},
    "X-2": {"statement": "second | clause with a pipe", "source": "s", "basis": "implied", "severity": "data-loss"},
    "X-3": {"statement": "a " * 60 + "long one", "source": "s", "basis": "decision", "severity": "cosmetic"},
}


def _write(tmp_path, name, tests, target="impl", version="(source tree)", clauses=REGISTRY):
    path = tmp_path / name
    path.write_text(
        json.dumps({"target": target, "version": version, "capabilities": [], "clauses": clauses, "tests": tests})
    )
    return path


def _test(nodeid, outcome, *clauses, when="call", charged=None, message=""):
    record = {
        "nodeid": nodeid,
        "outcome": outcome,
        "when": when,
        "clauses": list(clauses),
        "duration": 0.1,
        "message": message,
    }
    if outcome in ("xfail", "xpass"):
        record["entry"] = {"clauses": list(charged or clauses[:1]), "verdict": None, "intermittent": None}
    return record


def _rows(markdown):
    """Table rows (header, separator and body) as lists of cells."""
    table = [line for line in markdown.splitlines() if line.startswith("|")]
    return [[c.strip() for c in line.strip("|").split(" | ")] for line in table]


# ---------------------------------------------------------------------------------- input


def test_a_test_counts_once_with_its_worst_phase(tmp_path):
    run = load_run(
        _write(
            tmp_path,
            "a.json",
            [
                _test("t::a", "passed", "X-1"),
                _test("t::a", "error", "X-1", when="teardown"),
                _test("t::b", "passed", "X-1"),
            ],
        )
    )
    assert sorted(r.outcome for r in run.citing("X-1")) == ["error", "passed"]
    assert str(report.clause_verdict(run, "X-1", REGISTRY)) == "FAILS (not in expectations) (1 of 2 tests)"


def test_an_expected_failure_recorded_without_an_entry_charges_every_clause_it_cites(tmp_path):
    bare = {**_test("t::a", "xfail", "X-1", "X-2"), "message": "[X-2] a reason is not parsed"}
    del bare["entry"]
    record = load_run(_write(tmp_path, "a.json", [bare])).tests["t::a"]
    assert (record.charged, record.intermittent) == ({"X-1", "X-2"}, None)


def test_an_entry_charging_a_clause_the_test_does_not_cite_is_refused(tmp_path):
    path = _write(tmp_path, "a.json", [_test("t::a", "xfail", "X-1", charged=["X-3"])])
    with pytest.raises(ReportError, match=r"tests\[0\]\.entry\.clauses"):
        load_run(path)


# ---------------------------------------------------------------------------------- rendering


def test_one_row_per_registry_clause_one_column_per_target(tmp_path):
    impl = load_run(
        _write(tmp_path, "impl.json", [_test("t::a", "passed", "X-1"), _test("t::b", "failed", "X-1", "X-2")])
    )
    nvrx = load_run(
        _write(
            tmp_path,
            "nvrx.json",
            [_test("t::a", "xfail", "X-1"), _test("t::b", "skipped", "X-2")],
            target="nvrx",
            version="0.4.1",
            clauses={},
        )
    )
    rows = _rows(render([impl, nvrx], REGISTRY))
    header, separator, body = rows[0], rows[1], rows[2:]
    assert header == ["clause", "statement", "basis", "severity", "impl (source tree)", "nvrx 0.4.1"]
    assert len(separator) == len(header)
    assert [r[0] for r in body] == ["X-1", "X-2", "X-3"]
    assert all(len(r) == 6 for r in body)
    assert [r[2:] for r in body] == [
        ["documented", "hang", "FAILS (not in expectations) (1 of 2 tests)", "breaks its documentation"],
        ["implied", "data-loss", "FAILS (not in expectations)", "skipped"],
        ["decision", "cosmetic", "not covered", "not covered"],
    ]


def test_statements_are_shortened_and_escaped(tmp_path):
    run = load_run(_write(tmp_path, "a.json", []))
    body = render([run], REGISTRY).splitlines()
    assert "second \\| clause with a pipe" in body[3]
    long_statement = _rows(render([run], REGISTRY))[4][1]
    assert long_statement.endswith("…")
    assert len(long_statement) <= 70


def test_legend_and_summary_lines(tmp_path):
    run = load_run(
        _write(
            tmp_path,
            "a.json",
            [
                _test("t::a", "passed", "X-1"),
                _test("t::b", "xpass", "X-1"),
                _test("t::c", "xfail", "X-2"),
                _test("t::d", "skipped", "X-2"),
                _test("t::meta", "passed"),
            ],
        )
    )
    text = render([run], REGISTRY)
    below = text.split("\n\n", 1)[1]
    assert below.startswith("Words: **passes**")
    assert "Measured with cpu tensors (gloo)." in below
    assert "- **impl (source tree)**: passes 1; misses an implied rule 1; not covered 1" in below


def test_registry_defaults_to_clauses_toml(tmp_path):
    run = load_run(_write(tmp_path, "a.json", [], clauses={}))
    body = _rows(render([run]))[2:]
    assert [r[0] for r in body] == list(clause_registry.load())
    assert {r[4] for r in body} == {"not covered"}


def test_clauses_unknown_to_the_registry_still_get_rows(tmp_path):
    clauses = {**REGISTRY, "OLD-1": {"statement": "removed since", "source": "s"}}
    run = load_run(_write(tmp_path, "a.json", [_test("t::a", "passed", "OLD-1")], clauses=clauses))
    assert _rows(render([run], REGISTRY))[-1] == ["OLD-1", "removed since", "documented", "", "passes"]


# ---------------------------------------------------------------------------------- --update


def test_update_replaces_only_the_marked_block(tmp_path):
    readme = tmp_path / "README.md"
    before, after = "# Title\n\nintro\n", "\n## After\ntext\n"
    readme.write_text(f"{before}{START_MARKER}\nold table\nmore\n{END_MARKER}{after}")
    source = _write(tmp_path, "a.json", [_test("t::a", "passed", "X-1")])
    assert main([str(source), "--update", str(readme)]) == 0
    text = readme.read_text()
    start = text.index(START_MARKER) + len(START_MARKER) + 1
    assert text.startswith(before + START_MARKER + "\n")
    assert text.endswith(END_MARKER + after)
    assert "old table" not in text
    assert text[start : text.index(END_MARKER)] == render([load_run(source)])


def test_update_is_idempotent():
    text = f"a\n{START_MARKER}\n{END_MARKER}\nb\n"
    once = replace_block(text, "| t |\n")
    assert replace_block(once, "| t |\n") == once == f"a\n{START_MARKER}\n| t |\n{END_MARKER}\nb\n"


@pytest.mark.parametrize(
    "text",
    [
        "no markers\n",
        f"{START_MARKER}\nonly a start\n",
        f"only an end\n{END_MARKER}\n",
        f"{END_MARKER}\nreversed\n{START_MARKER}\n",
        f"{START_MARKER}\n{END_MARKER}\n{START_MARKER}\n{END_MARKER}\n",
    ],
)
def test_update_without_a_single_marked_block_fails_clearly(tmp_path, capsys, text):
    readme = tmp_path / "README.md"
    readme.write_text(text)
    assert main([str(_write(tmp_path, "a.json", [])), "--update", str(readme)]) == 1
    err = capsys.readouterr().err
    assert str(readme) in err
    assert START_MARKER in err
    assert END_MARKER in err
    assert readme.read_text() == text


def test_stdout_without_update(tmp_path, capsys):
    assert main([str(_write(tmp_path, "a.json", [_test("t::a", "passed", "X-1")]))]) == 0
    out = capsys.readouterr().out
    assert out.startswith("| clause | statement | basis | severity | impl (source tree) |")


# ---------------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({"version": "1", "clauses": {}, "tests": []}), "'target'"),
        (json.dumps({"target": "impl", "version": "1", "clauses": {}, "tests": {}}), "'tests'"),
        (json.dumps({"target": "impl", "version": "1", "clauses": {"X-1": "s"}, "tests": []}), "'clauses'"),
        (
            json.dumps({"target": "impl", "version": "1", "clauses": {}, "tests": [_test("t::a", "weird")]}),
            "tests[0].outcome 'weird'",
        ),
        (
            json.dumps(
                {
                    "target": "impl",
                    "version": "1",
                    "clauses": {},
                    "tests": [{"nodeid": "t::a", "outcome": "passed", "clauses": "X-1"}],
                }
            ),
            "tests[0].clauses",
        ),
        (json.dumps({"target": "impl", "version": "1", "clauses": {}, "tests": ["t::a"]}), "tests[0] is not an object"),
    ],
)
def test_bad_json_is_an_error_naming_the_file(tmp_path, capsys, content, problem):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ReportError, match=str(path)) as info:
        load_run(path)
    assert problem in str(info.value)
    assert main([str(path)]) == 1
    err = capsys.readouterr().err
    assert str(path) in err
    assert problem in err


def test_missing_file_is_an_error_naming_it(tmp_path, capsys):
    path = tmp_path / "absent.json"
    assert main([str(path)]) == 1
    assert f"{path}: cannot read" in capsys.readouterr().err


def test_no_input_reports_the_stored_runs(capsys):
    """Without JSON files or --run, the table is that of the stored runs this copy carries, in the release list's
    order (impl first)."""
    assert main(["--areas", "protocol"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    columns = [c.strip() for c in header.strip("|").split("|")][4:]
    assert columns[0] == "impl (source tree)", columns
    assert {"nvrx 0.7.0", "torchtitan 0.3.0"} <= set(columns), columns
    assert len(columns) == len(stored_runs()), columns


# ---------------------------------------------------------------------------------- --run


@pytest.fixture
def fake_pytest(monkeypatch):
    """Replace the suite run: record each command and write a JSON file, exiting with `codes`."""
    calls: list = []
    codes: dict[str, int] = {}

    def fake_run(command, **kwargs):
        target = command[command.index("--impl") + 1]
        json_path = command[command.index("--conformance-json") + 1]
        calls.append((command, kwargs))
        outcome = "failed" if target == "nvrx" else "passed"
        with open(json_path, "w") as f:
            json.dump(
                {
                    "target": target,
                    "version": "v",
                    "capabilities": [],
                    "clauses": {},
                    "tests": [_test("t::a", outcome, "X-1")],
                },
                f,
            )
        return subprocess.CompletedProcess(command, codes.get(target, 0))

    monkeypatch.setattr(subprocess, "run", fake_run)  # the module runs.py calls
    return calls, codes


def test_run_runs_each_target_then_reports(tmp_path, fake_pytest, capsys, monkeypatch):
    calls, codes = fake_pytest
    codes["nvrx"] = 1  # a failing suite is data, not an error
    monkeypatch.setattr(clause_registry, "load", lambda areas=None: REGISTRY)  # the module report.py reads
    out = tmp_path / "conf"
    out.mkdir()
    assert main(["--run", "impl", "nvrx", "--out", str(out)]) == 0
    commands = [command for command, _ in calls]
    assert [c[c.index("--impl") + 1] for c in commands] == ["impl", "nvrx"]
    for command, target in zip(commands, ["impl", "nvrx"], strict=True):
        assert command[1:] == [
            "-m",
            "pytest",
            "ckptspec/spec",
            *runs.RUN_OPTIONS,
            "--impl",
            target,
            "--conformance-json",
            str((out / f"{target}.json").resolve()),
        ]
    assert all(kwargs["cwd"] == runs.REPO_ROOT for _, kwargs in calls)
    rows = _rows(capsys.readouterr().out)
    assert rows[0][4:] == ["impl v", "nvrx v"]
    assert rows[2][4:] == ["passes", "FAILS (not in expectations)"]


def test_run_with_update(tmp_path, fake_pytest):
    readme = tmp_path / "README.md"
    readme.write_text(f"{START_MARKER}\n{END_MARKER}\n")
    out = tmp_path / "conf"
    out.mkdir()
    assert main(["--run", "impl", "--out", str(out), "--update", str(readme)]) == 0
    assert "| impl v |" in readme.read_text().splitlines()[1]


def test_run_with_an_unexpected_exit_code_names_the_target(tmp_path, fake_pytest, capsys):
    _, codes = fake_pytest
    codes["mcore"] = 4
    out = tmp_path / "conf"
    out.mkdir()
    assert main(["--run", "mcore", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "'mcore'" in err
    assert "code 4" in err


def test_areas_not_asked_for_get_no_rows(tmp_path):
    chosen = clause_registry.load(("async_ckpt",))
    everything = clause_registry.load()
    fault_id = next(cid for cid in everything if cid.startswith("FI-"))
    run = load_run(_write(tmp_path, "a.json", [_test("t::a", "passed", fault_id)], clauses=everything))
    body = _rows(render([run], chosen))[2:]
    assert [r[0] for r in body] == list(chosen)
    assert fault_id not in chosen
    assert fault_id not in {r[0] for r in body}


def test_an_unknown_area_is_refused():
    with pytest.raises(ValueError, match="unknown clause areas"):
        clause_registry.load(("nope",))


def test_a_release_label_runs_its_nox_session(tmp_path, monkeypatch):
    calls: list = []

    def fake_run(command, **kwargs):
        calls.append(command)
        with open(command[command.index("--conformance-json") + 1], "w") as f:
            json.dump({"target": "nvrx", "version": "0.7.0", "capabilities": [], "clauses": {}, "tests": []}, f)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(subprocess, "run", fake_run)  # the module runs.py calls
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object())
    json_path = tmp_path / "nvrx-0.7.0.json"
    runs.run_target("nvrx-0.7.0", json_path, suite="ckptspec/faults")
    assert calls == [
        [
            sys.executable,
            "-m",
            "nox",
            "-r",
            "-s",
            "spec(nvrx-0.7.0)",
            "--",
            "ckptspec/faults",
            "--conformance-json",
            str(json_path),
        ]
    ]
    # Names that are targets, not releases, run here.
    assert "--impl" in runs.pytest_command("dcp-thread", json_path)


def test_a_release_label_without_nox_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ReportError, match="nox is not installed"):
        runs.run_target("mcore-0.19.2", tmp_path / "x.json")


@pytest.mark.parametrize(
    ("label", "clause", "word"),
    [
        ("torchtitan 0.3.0", "TAC-5", "not applicable (no such module)"),  # async_ckpt: not the release's area
        ("dcp-thread 2.15.0", "AQ-1", "not applicable (no such module)"),
        ("torchtitan 0.3.0", "P-SNAP-1", "not covered"),  # protocol: its area, so a missing test is a gap
        ("nvrx 0.7.0", "TAC-5", "not covered"),  # judged on async_ckpt: a missing test is a gap
        ("mytarget 1.0", "TAC-5", "not covered"),  # not a listed release: nothing known of its areas
    ],
)
def test_a_clause_outside_the_release_s_areas_is_not_applicable_even_when_unrecorded(label, clause, word):
    """A stored run older than a clause of an NVRx area reads it as its tests would have run there: skipped for a
    release not judged on that area (ckptspec.spec.harness.applicability), not "not covered"."""
    registry = clause_registry.load()
    run = runs.Run(label, registry, {})
    assert report.clause_verdict(run, clause, registry).word == word
