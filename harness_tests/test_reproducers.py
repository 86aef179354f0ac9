"""The standalone reproducers of findings/repro (issue 30): each holds on impl, stands alone, and covers its page.

A reproducer `findings/repro/<target>-<release>/<clause>.py PACKAGE` exits 1 on the release it was written for
(verified there by hand, through the release's nox environment: see docs/findings) and must exit 0 on impl, which
CI checks here for every reproducer file (a symlink shares its file with an earlier release and runs once).
A reproducer of a library without NVRx's module paths (LIBRARIES: Lightning, torchtitan, DeepSpeed, transformers, torch_checkpointing) takes that library's package, has no
impl to hold on, and may import the library; CI checks its form, and it is verified by hand in the release's
environment.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from ckptspec.report.runs import REPO_ROOT

REPRO = REPO_ROOT / "findings" / "repro"
FINDINGS = REPO_ROOT / "docs" / "findings"
SCRIPTS = sorted(p for p in REPRO.glob("*/*.py") if not p.is_symlink())
LINKS = sorted(p for p in REPRO.glob("*/*.py") if p.is_symlink())
# What a reproducer may import: the standard library, torch, and the shared module beside it.
_ALLOWED_ROOTS = {"torch", "_common", *sys.stdlib_module_names}
# Protocol-only libraries (target name -> the packages its reproducers may import): no impl equivalent.
LIBRARIES = {
    "lightning": {"pytorch_lightning", "lightning_fabric"},
    "torchtitan": {"torchtitan"},
    "deepspeed": {"deepspeed"},
    "transformers": {"transformers"},
    "torch-checkpointing": {"torch_checkpointing"},
}


def _library(path: Path) -> set[str]:
    return LIBRARIES.get(path.parent.name.rsplit("-", 1)[0], set())


NVRX_SHAPED = [p for p in SCRIPTS if not _library(p)]
_BREAK = re.compile(r"^### (?P<clause>\S+) \((?P<severity>[\w-]+)\): (?P<word>.*)$")


def _name(path: Path) -> str:
    return str(path.relative_to(REPRO))


@pytest.mark.parametrize("script", NVRX_SHAPED, ids=_name)
def test_the_reproducer_holds_on_impl(script):
    done = subprocess.run(
        [sys.executable, str(script), "impl"], capture_output=True, text=True, timeout=180, cwd=REPO_ROOT
    )
    assert done.returncode == 0, (
        f"{_name(script)} impl: exit {done.returncode}, should be 0 with a HOLDS line\n"
        f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    )
    assert "HOLDS: " in done.stdout, (
        f"{_name(script)} impl: exit {done.returncode}, should be 0 with a HOLDS line\n"
        f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"
    )


@pytest.mark.parametrize("script", SCRIPTS, ids=_name)
def test_the_reproducer_needs_only_torch_and_the_library(script):
    tree = ast.parse(script.read_text())
    roots = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    roots |= {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    allowed = _ALLOWED_ROOTS | _library(script)
    assert roots <= allowed, f"{_name(script)} imports {sorted(roots - allowed)}"
    assert ast.get_docstring(tree), f"{_name(script)} has no docstring (clause, source, mechanism, usage)"


def test_every_link_is_a_reproducer_of_another_release():
    for link in LINKS:
        target = link.resolve()
        assert target in SCRIPTS, f"{_name(link)} -> {target}"
        assert target.parent != link.parent, f"{_name(link)} -> {target}"


def test_every_reproducer_belongs_to_a_findings_page():
    pages = {p.stem for p in FINDINGS.glob("*.md")}
    for path in [*SCRIPTS, *LINKS]:
        assert path.parent.name in pages, f"{_name(path)}: no docs/findings/{path.parent.name}.md"


def test_an_unknown_package_argument_is_a_usage_error():
    done = subprocess.run(
        [sys.executable, str(SCRIPTS[0]), "no_such_package"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert "usage:" in done.stderr, (done.returncode, done.stderr)


def test_every_data_loss_or_hang_break_has_a_reproducer():
    missing = []
    for page in sorted(FINDINGS.glob("*.md")):
        blocks = page.read_text().split("\n### ")
        for block in blocks[1:]:
            head = _BREAK.match("### " + block.splitlines()[0])
            if head and head["severity"] in ("data-loss", "hang") and "- **Reproducer**: not yet written" in block:
                missing.append(f"{page.stem}: {head['clause']} ({head['severity']}, {head['word']})")
    assert not missing, "breaks of severity data-loss or hang without a reproducer:\n" + "\n".join(missing)
