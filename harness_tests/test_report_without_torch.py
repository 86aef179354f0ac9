"""The reports need no torch (issue 59 item 2): `ckptspec.report` renders every page from the stored runs in a
process where torch, pytest, hypothesis and numpy cannot be imported.

The process blocks those imports (a meta path finder that raises ImportError), then renders what `python
regenerate.py` renders from the stored runs: the conformance table of every area, each stored run's findings page
and its HTML copy, the results page, Findings at a glance, the maintainer reports, and the fault matrix's data
through `ckptspec report`. An installed copy without torch is checked by harness_tests/test_packaging.py.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

from harness_tests.pytest_runs import REPO_ROOT

BLOCKED = ("torch", "pytest", "hypothesis", "numpy", "_pytest")

RENDER = textwrap.dedent(
    """
    import sys
    from pathlib import Path

    class Blocked:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {blocked!r}:
                raise ImportError(f"{{name}} is blocked: the reports must not need it")
            return None

    sys.meta_path.insert(0, Blocked())
    out = Path(sys.argv[1])

    from ckptspec import cli
    from ckptspec.report import glance, report, repro_reports
    from ckptspec.report.runs import stored_runs

    stored = [str(path) for path in stored_runs()]
    assert cli.main(["report", "--update", str(out / "table.md")]) == 0
    assert cli.main(["findings", "--out", str(out / "findings")]) == 0
    assert report.main(["--html", str(out / "results.html")]) == 0
    assert glance.main([*stored, "--update", str(out / "glance.md")]) == 0
    assert repro_reports.main([*stored, "--out", str(out / "repro")]) == 0
    print(len(stored), sorted(m for m in sys.modules if m.split(".")[0] in {blocked!r}))
    """
).format(blocked=set(BLOCKED))


def test_every_page_renders_with_torch_and_pytest_unimportable(tmp_path):
    (tmp_path / "table.md").write_text("<!-- conformance:start -->\n<!-- conformance:end -->\n")
    (tmp_path / "glance.md").write_text("<!-- glance:start -->\n<!-- glance:end -->\n")
    done = subprocess.run(
        [sys.executable, "-c", RENDER, str(tmp_path)],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    count, imported = done.stdout.split(" ", 1)
    assert int(count) >= 10, done.stdout
    assert imported.strip() == "[]", f"blocked modules imported: {imported}"
    pages = sorted((tmp_path / "findings").glob("*.md"))
    assert len(pages) == int(count), [p.name for p in pages]
    assert all(p.with_suffix(".html").is_file() for p in pages)
    assert "nvrx 0.7.0" in (tmp_path / "table.md").read_text()
    assert "nvrx-0.7.0" in (tmp_path / "results.html").read_text()
    assert "| severity | what goes wrong |" in (tmp_path / "glance.md").read_text()
    assert list((tmp_path / "repro").rglob("*.md")), "no maintainer report rendered"
