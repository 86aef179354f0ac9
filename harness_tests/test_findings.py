"""Findings pages (issue 30): what a release breaks, documented and implied first, by severity, with mechanism."""

from __future__ import annotations

import json
from typing import Any

from ckptspec.report import findings
from ckptspec.report.runs import REPO_ROOT, load_run

REGISTRY: dict[str, dict[str, Any]] = {
    "D-1": {"statement": "cosmetic promise", "source": "002 'quote'", "basis": "documented", "severity": "cosmetic"},
    "D-2": {"statement": "no data loss", "source": "000 'quote'", "basis": "documented", "severity": "data-loss"},
    "I-1": {"statement": "implied hang", "source": "003 code", "basis": "implied", "severity": "hang"},
    "C-1": {"statement": "a choice", "source": "torch DCP", "basis": "decision", "decision": "why", "severity": "leak"},
    "P-1": {"statement": "passes", "source": "000", "basis": "documented", "severity": "hang"},
}


def _xfail(nodeid: str, clause: str, reason: str) -> dict:
    entry = {"clauses": [clause], "verdict": None, "intermittent": None}
    return {
        "nodeid": nodeid,
        "outcome": "xfail",
        "clauses": [clause],
        "message": f"[{clause}] {reason}",
        "entry": entry,
    }


def test_a_page_lists_the_breaks_by_basis_and_severity(tmp_path):
    tests = [
        _xfail("t.py::cosmetic", "D-1", "returns a tensor"),
        _xfail("t.py::lost", "D-2", "the worker reads shared memory"),
        _xfail("t.py::hang", "I-1", "joins forever"),
        _xfail("t.py::choice", "C-1", "leaves a child"),
        {"nodeid": "t.py::ok", "outcome": "passed", "clauses": ["P-1"]},
    ]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"target": "lib", "version": "1.0", "clauses": REGISTRY, "tests": tests}))
    run = load_run(path)
    (tmp_path / findings.REPRO_DIR / "lib-1.0").mkdir(parents=True)
    (tmp_path / findings.REPRO_DIR / "lib-1.0" / "D-2.py").write_text("")
    text = findings.page(run, REGISTRY, root=tmp_path)
    assert findings.page_name(run) == "lib-1.0"
    breaks = text.split("## Breaks: documented and implied clauses (3)")[1].split("## Stricter")[0]
    order = [line.split()[1] for line in breaks.splitlines() if line.startswith("### ")]
    assert order == ["D-2", "I-1", "D-1"]  # data-loss, hang, cosmetic
    assert "- **Mechanism**: the worker reads shared memory" in breaks
    assert "- **Test**: `t.py::lost`" in breaks
    assert "[`findings/repro/lib-1.0/D-2.py`]" in breaks
    assert "- **Reproducer**: not yet written" in breaks
    assert '- <a id="clause-c-1"></a>C-1 (leak): a choice' in text.split("## Stricter")[1]
    assert "P-1" not in text


def test_a_documented_clause_judged_as_a_decision_for_this_target_is_not_a_break(tmp_path):
    record = _xfail("t.py::cpu_snapshot", "D-2", "CPU tensors are shared")
    record["entry"]["verdict"] = "decision"
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"target": "lib", "version": "1.0", "clauses": REGISTRY, "tests": [record]}))
    text = findings.page(load_run(path), REGISTRY, root=tmp_path)
    assert "## Breaks: documented and implied clauses (0)" in text
    assert '- <a id="clause-d-2"></a>D-2 (data-loss): no data loss' in text.split("## Stricter")[1]


def test_a_data_loss_or_hang_break_says_what_the_release_still_keeps(tmp_path):
    registry = {
        **REGISTRY,
        "D-2w": {
            "statement": "weak",
            "source": "s",
            "basis": "decision",
            "decision": "w",
            "severity": "data-loss",
            "weakens": "D-2",
        },
        "I-1": {**REGISTRY["I-1"], "no_weak_level": "nothing weaker to promise"},
        "D-3": {"statement": "bare", "source": "000", "basis": "documented", "severity": "hang"},
    }
    tests = [_xfail("t.py::lost", "D-2", "m"), _xfail("t.py::weak", "D-2w", "m"), _xfail("t.py::hang", "I-1", "m")]
    tests += [_xfail("t.py::bare", "D-3", "m"), _xfail("t.py::cosmetic", "D-1", "m")]
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"target": "lib", "version": "1.0", "clauses": registry, "tests": tests}))
    text = findings.page(load_run(path), registry, root=tmp_path)
    entries = {part.split()[0]: part for part in text.split("## Stricter")[0].split("### ")[1:]}
    assert "- **Weak level**: D-2w: stricter than documented" in entries["D-2"]
    assert "- **Weak level**: none applies: nothing weaker to promise" in entries["I-1"]
    assert "- **Weak level**: none yet" in entries["D-3"]
    assert "Weak level" not in entries["D-1"]  # cosmetic: no weak level asked


def test_a_target_whose_entry_says_its_own_severity_is_judged_by_it(tmp_path):
    lost = _xfail("t.py::lost", "D-2", "a loud assertion, nothing written")
    lost["entry"]["severity"] = "wrong-error"
    path = tmp_path / "run.json"
    path.write_text(json.dumps({"target": "lib", "version": "1.0", "clauses": REGISTRY, "tests": [lost]}))
    text = findings.page(load_run(path), REGISTRY, root=tmp_path)
    assert "### D-2 (wrong-error): breaks its documentation" in text
    assert "Weak level" not in text.split("## Stricter")[0]  # asked only of a data-loss or hang break


def test_a_page_does_not_depend_on_the_order_a_parallel_run_finished_its_tests(tmp_path):
    """Two runs holding the same records in the opposite order (xdist finishes tests in any order) give the same
    page: mechanisms and tests are listed by node id."""
    tests = [_xfail("t.py::b_second", "D-2", "reason of b"), _xfail("t.py::a_first", "D-2", "reason of a")]
    pages: list[str] = []
    for order in (tests, tests[::-1]):
        path = tmp_path / f"run-{len(pages)}.json"
        path.write_text(json.dumps({"target": "lib", "version": "1.0", "clauses": REGISTRY, "tests": order}))
        pages.append(findings.page(load_run(path), REGISTRY, root=tmp_path))
    assert pages[0] == pages[1]
    assert pages[0].index("reason of a") < pages[0].index("reason of b")


def test_a_source_links_the_seeds_it_cites_and_every_page_has_their_key():
    """Issue 61 item 6: "000" / "002" in a clause's source are links to the documents, with a key on the page."""
    from ckptspec.report.clauses import SEEDS, markdown_source

    linked = markdown_source("002 AsyncRequest.freeze: 'Freezes ...'; 000 usage guide; torch 2.004; 0.004 s; 0091")
    assert linked.startswith(f'[002]({SEEDS["002"][1]} "{SEEDS["002"][0]}") AsyncRequest.freeze')
    assert f"[000]({SEEDS['000'][1]}" in linked
    assert linked.endswith("torch 2.004; 0.004 s; 0091"), linked
    page = (REPO_ROOT / "docs" / "findings" / "nvrx-0.7.0.md").read_text()
    assert f"source: [002]({SEEDS['002'][1]}" in page
    assert "## Sources" in page
    assert all(url in page for _, url in SEEDS.values())


def test_a_strict_break_is_shown_by_its_weak_levels_reproducer_when_the_release_breaks_both():
    """One mechanism, one reproducer: AQ-11 on Megatron-Core breaks its weak level AQ-11w too, whose reproducer
    shows both; a clause with neither reproducer has none."""
    from ckptspec.report import clauses

    registry = clauses.load()
    run = load_run(REPO_ROOT / "conformance" / "all" / "mcore-0.19.2.json")
    shown = findings.shown_by(run, "AQ-11", registry)
    assert shown == (findings.repro_path(run, "AQ-11w"), "AQ-11w")
    assert findings.shown_by(run, "AQ-11w", registry) == (findings.repro_path(run, "AQ-11w"), "AQ-11w")
    impl = load_run(REPO_ROOT / "conformance" / "all" / "impl.json")
    assert findings.shown_by(impl, "AQ-11", registry) is None


def test_a_release_s_unjudged_configuration_opens_its_findings_page():
    """A release whose stored run leaves out a configuration its users run (releases.Release.unjudged: torchtitan's
    async_with_pinned_mem) says so on its committed findings page, above the verdicts."""
    from ckptspec.report import releases

    listed = [r for r in releases.RELEASES if r.unjudged]
    assert "torchtitan-0.3.0" in {r.name for r in listed}
    for release in listed:
        page = (REPO_ROOT / "docs" / "findings" / f"{release.name}.md").read_text()
        line = f"**Not judged**: {release.unjudged}."
        assert line in page, f"{release.name}: its findings page does not say what it leaves unjudged"
        assert page.index(line) < page.index("## Breaks"), f"{release.name}: the unjudged line comes after the verdicts"
