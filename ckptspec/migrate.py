"""Rewrite the names of ckptspec 0.2 (four top-level packages) to those of 0.3 (one: `ckptspec`).

    python -m ckptspec.migrate PATH ...           rewrite the files in place (directories: every text file below)
    python -m ckptspec.migrate --check PATH ...   change nothing; exit 1 naming each file that still has an old name

0.2 installed `impl`, `spec_tests`, `fault_injection` and `benchmarks` side by side; 0.3 installs them as
`ckptspec.impl`, `ckptspec.spec`, `ckptspec.faults` and `ckptspec.bench`. What refers to them by name moves with
them: pytest node ids (`spec_tests/async_ckpt/test_queue.py::test_x` in an expectations file, a stored run, a
`ckptspec judge` JSON), module paths (`spec_tests.harness.plugin`, an adapter's `"impl." + path`), import
statements, and file paths in prose. This project's own tree and stored runs were migrated by this module (CHANGELOG,
0.3.0); a user runs it over their own adapter, expectations file or stored runs.

What is not rewritten: `impl` as a target name (`--impl impl`, `conformance/all/impl.json`, `impl.expectations.toml`,
`dcp:impl`), the word "benchmarks" in prose and in `docs/benchmarks.md`, pytest-benchmark's `.benchmarks/`.
Applied twice, it changes nothing the second time (harness_tests/test_migrate.py).

Standard library only.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["MOVED", "OLD_TO_NEW", "main", "migrate_text"]

OLD_TO_NEW = {
    "spec_tests": "ckptspec.spec",
    "fault_injection": "ckptspec.faults",
    "benchmarks": "ckptspec.bench",
    "impl": "ckptspec.impl",
}
"""Each 0.2 top-level package and the 0.3 module it became."""

MOVED = {
    "ckptspec.spec.harness.target.protocol": "ckptspec.spec.harness.surface.saver_api",
    "ckptspec.spec.harness.target.manager": "ckptspec.spec.harness.surface.manager_api",
    "ckptspec.spec.harness.target": "ckptspec.spec.harness.surface",
    "ckptspec.spec.harness.records.record_failures": "ckptspec.spec.harness.record_failures",
    "ckptspec.spec.harness.records": "ckptspec.report",
    "ckptspec.spec.harness.cli": "ckptspec.cli",
    "ckptspec.spec.harness.clauses": "ckptspec.report.clauses",
    "ckptspec.spec.harness.installed": "ckptspec.report.installed",
    "ckptspec.faults.faultfs": "ckptspec.spec.drivers.faults.faultfs",
    "ckptspec.faults.crash_points": "ckptspec.spec.drivers.faults.crash_points",
    "ckptspec.faults.preemption": "ckptspec.spec.drivers.faults.preemption",
}
"""Modules that moved inside the package in 0.3, after the rename (as module paths; their files' paths move alike):
the adapter surface (`target` is `surface`, its `protocol` layer `saver_api`), the reports (`records` is
`ckptspec.report`), the command line, and the fault machinery the suites share (a driver now)."""

# impl's own first-level names: `impl.` followed by anything else is a target name (`impl.expectations.toml`).
_IMPL_MODULES = "async_ckpt|local|integrity|utils|manager|dict_utils|debug_log|core"
_SUFFIXES = "md|html|yml|yaml|json|toml|py|txt|out|png|svg"
# Not after a name character, a dot, a dash or a colon (`dcp:impl`, `.benchmarks/`, `my_benchmarks/`), nor after
# `docs/` or `examples/` (docs/benchmarks.md, docs/examples/benchmarks.yml), nor after the new root already.
_BEFORE = r"(?<![\w.:-])(?<!docs/)(?<!examples/)(?<!ckptspec/)(?<!ckptspec\.)"


def _rules() -> list[tuple[re.Pattern[str], str]]:
    rules: list[tuple[re.Pattern[str], str]] = []
    for old, new in OLD_TO_NEW.items():
        path, dotted = new.replace(".", "/"), new
        module_next = rf"(?=(?:{_IMPL_MODULES})\b)" if old == "impl" else rf"(?=[A-Za-z_])(?!(?:{_SUFFIXES})\b)"
        rules += [
            # a path or node id: spec_tests/async_ckpt/test_queue.py, ../benchmarks/README.md
            (re.compile(rf"{_BEFORE}{old}/" + (rf"(?=(?:{_IMPL_MODULES})\b)" if old == "impl" else "")), path + "/"),
            # a dotted module path: spec_tests.harness.plugin, "impl.async_ckpt.core"
            (re.compile(rf"{_BEFORE}{old}\.{module_next}"), dotted + "."),
            # an import of the package itself: `from benchmarks import summary`, `import spec_tests`
            (re.compile(rf"(?m)^(\s*(?:from|import)\s+){old}\b(?![./])"), rf"\g<1>{dotted}"),
        ]
    # Bare names that are unambiguous (a directory or package named in prose or a list of paths).
    for old in ("spec_tests", "fault_injection"):
        rules.append((re.compile(rf"{_BEFORE}\b{old}\b"), OLD_TO_NEW[old].replace(".", "/")))
    # Then the moves inside the package (the names an adapter imports first: the protocol layer's Saver).
    for old, new in MOVED.items():
        for sep in (".", "/"):
            before, after = old.replace(".", sep), new.replace(".", sep)
            # `installed.toml` stayed in the harness: only the module moved.
            rules.append((re.compile(rf"(?<![\w.]){re.escape(before)}\b(?!\.toml)"), after))
    for name, home in (("clauses", "ckptspec.report"), ("installed", "ckptspec.report")):
        rules.append((re.compile(rf"\bfrom ckptspec\.spec\.harness import {name}\b"), f"from {home} import {name}"))
    return rules


_RULES = _rules()
_TEXT_SUFFIXES = {
    ".py",
    ".toml",
    ".json",
    ".md",
    ".html",
    ".yml",
    ".yaml",
    ".txt",
    ".out",
    ".cfg",
    ".ini",
    ".sh",
    "",
}


def migrate_text(text: str) -> str:
    """`text` with every 0.2 name rewritten to its 0.3 name (idempotent)."""
    for pattern, replacement in _RULES:
        text = pattern.sub(replacement, text)
    return text


def _files(paths: Sequence[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(
                p
                for p in path.rglob("*")
                if p.is_file() and p.suffix in _TEXT_SUFFIXES and ".git" not in p.parts and "__pycache__" not in p.parts
            )
        elif path.is_file():
            found.append(path)
        else:
            raise SystemExit(f"ckptspec.migrate: {path}: no such file or directory")
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptspec.migrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("paths", nargs="+", type=Path, help="files, or directories to walk")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a file has an old name")
    args = parser.parse_args(argv)
    stale = []
    for path in _files(args.paths):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # not a text file: nothing of ours to rename inside it
        new = migrate_text(text)
        if new == text:
            continue
        stale.append(path)
        if not args.check:
            path.write_text(new, encoding="utf-8")
    verb = "has old names" if args.check else "rewritten"
    for path in stale:
        print(f"{path}: {verb}")
    print(f"ckptspec.migrate: {len(stale)} file(s) {verb}", file=sys.stderr)
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    raise SystemExit(main())
