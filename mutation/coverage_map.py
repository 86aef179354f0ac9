"""Which tests of a group execute each line of impl: the map that picks and orders the tests run per mutant.

`build` runs the group's tests once on the unmutated tree under coverage.py (every process measured through its
`patch = subprocess, fork, _exit`; each line labelled with the test that ran it by `mutation.contexts`), and
stores {module: {line: [node ids]}} with each test's duration. `Map.tests_for` answers, for a mutant's lines,
the tests that executed them, fastest first, or None when the whole group must run: the line runs at import
time (module or class level, executed by every test). An empty list means no labelled test executed the line.
A process's label is process-wide in coverage.py, so a background thread still running after its test's body
returned records its lines unlabelled (""): such a line's list may miss tests, which is why a mutant the listed
tests do not kill is judged by the whole group (mutation.run).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

RC = """\
[run]
source = impl
data_file = {data}
parallel = true
patch =
    subprocess
    fork
    _exit
plugins = mutation.contexts
"""


@dataclass
class Map:
    lines: dict[str, dict[int, list[str]]]  # module (relative to the tree) -> line -> node ids, "" = unlabelled
    durations: dict[str, float]  # node id -> seconds, in the order the tests ran
    seconds: float  # the whole run (the baseline, under coverage)
    _bodies: dict[str, list[tuple[int, int]]] = field(default_factory=dict)

    def tests_for(self, tree: Path, module: str, first: int, last: int) -> list[str] | None:
        if not all(self._in_function_body(tree, module, line) for line in range(first, last + 1)):
            return None
        ids: set[str] = set()
        for line in range(first, last + 1):
            ids.update(self.lines.get(module, {}).get(line, ()))
        ids.discard("")  # run in a process while no test's label was current (a thread outliving its body)
        return sorted(ids, key=lambda t: (self.durations.get(t, float("inf")), t))

    def _in_function_body(self, tree: Path, module: str, line: int) -> bool:
        if module not in self._bodies:
            self._bodies[module] = function_bodies((tree / module).read_text())
        return any(start <= line <= end for start, end in self._bodies[module])


def function_bodies(source: str) -> list[tuple[int, int]]:
    """Line spans of every function's body: code there runs when the function is called, not at import."""
    spans = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            spans.append((node.body[0].lineno, node.end_lineno or node.body[-1].lineno))
        elif isinstance(node, ast.Lambda):
            spans.append((node.body.lineno, node.body.end_lineno or node.body.lineno))
    return spans


def _nodeid(tree: Path, case: ET.Element) -> str:
    """A junit testcase's pytest node id (classname ckptspec.spec.x.test_m[.Class], name test_f[param])."""
    parts = case.get("classname", "").split(".")
    for cut in range(len(parts), 0, -1):
        path = "/".join(parts[:cut]) + ".py"
        if (tree / path).exists():
            return "::".join([path, *parts[cut:], case.get("name", "")])
    return case.get("name", "")


def build(name: str, tree: Path, command: list[str], env: dict[str, str], work: Path) -> Map:
    """Run the pytest `command` (argv after `python -m pytest`) once under coverage in `tree` (unmutated):
    the tests must pass. Its data files, rcfile and junit report are written to `work` under `name`."""
    from coverage import CoverageData

    data, rc, junit = work / f"{name}.coverage", work / f"{name}.coveragerc", work / f"{name}.junit.xml"
    rc.write_text(RC.format(data=data))
    coverage = [sys.executable, "-m", "coverage"]
    subprocess.run([*coverage, "erase", f"--rcfile={rc}"], cwd=tree, check=True)  # an earlier run's data
    env = {**env, "CKPTSPEC_MUT_CONTEXT": str(work / f"{name}.context"), "CKPTSPEC_MUT_TREE": str(tree)}
    start = time.monotonic()
    argv = [*coverage, "run", f"--rcfile={rc}", "-m", "pytest", f"--junitxml={junit}", *command]
    proc = subprocess.run(argv, cwd=tree, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - start
    if proc.returncode != 0:
        sys.exit(f"{name}: tests fail without a mutant (under coverage):\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}")
    subprocess.run([*coverage, "combine", f"--rcfile={rc}", "-q"], cwd=tree, env=env, check=True)
    cov = CoverageData(str(data))
    cov.read()
    root = f"{tree}{os.sep}"
    lines = {
        filename.removeprefix(root): {n: sorted(c) for n, c in cov.contexts_by_lineno(filename).items()}
        for filename in cov.measured_files()
    }
    cases = ET.parse(junit).getroot().iter("testcase")
    durations = {_nodeid(tree, c): float(c.get("time", "0")) for c in cases}
    (work / f"{name}.map.json").write_text(json.dumps({"lines": lines, "durations": durations, "seconds": seconds}))
    return Map(lines, durations, seconds)


def load(path: Path) -> Map:
    """A map that `build` stored."""
    stored = json.loads(path.read_text())
    lines = {module: {int(n): ids for n, ids in by_line.items()} for module, by_line in stored["lines"].items()}
    return Map(lines, stored["durations"], stored["seconds"])
