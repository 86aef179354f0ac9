"""The import rules that import-linter's contracts (pyproject.toml) cannot state: names, not modules.

- No module imports a test module (`test_*.py`): what two test modules share lives in a module of its own.
- No module imports a private name (a leading underscore) of a module outside its own package.
- No two classes of the suite's packages share a name (one name per concept).
The layers themselves (who may import whom) are import-linter's, run by CI as `lint-imports`.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("ckptspec", "gpu_run", "mutation", "harness_tests")


def _modules() -> dict[str, Path]:
    """Every module of the suite's packages, by dotted name."""
    found = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            parts = path.relative_to(REPO).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imports(path: Path, name: str, is_package: bool) -> list[tuple[int, str, list[str]]]:
    """(line, imported module, imported names) of every `import` and `from ... import` in the file."""
    here = name if is_package else name.rpartition(".")[0]
    out: list[tuple[int, str, list[str]]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name, []) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = here.split(".")[: len(here.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            out.append((node.lineno, base, [alias.name for alias in node.names]))
    return out


def _problems(modules: dict[str, Path]) -> list[str]:
    problems: list[str] = []
    for name, path in sorted(modules.items()):
        for line, imported, names in _imports(path, name, path.name == "__init__.py"):
            where = f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{line}"
            targets = [imported] + [f"{imported}.{n}" for n in names if f"{imported}.{n}" in modules]
            problems.extend(
                f"{where} imports the test module {module}"
                for module in targets
                if module in modules and module.rpartition(".")[2].startswith("test_") and module != name
            )
            if imported not in modules:
                continue
            package = imported if modules[imported].name == "__init__.py" else imported.rpartition(".")[0]
            mine = name if path.name == "__init__.py" else name.rpartition(".")[0]
            private = [n for n in names if n.startswith("_") and not n.startswith("__")]
            if private and not (mine == package or mine.startswith(package + ".")):
                problems.append(f"{where} imports the private name(s) {', '.join(private)} of {imported}")
    return problems


def test_no_module_imports_a_test_module_or_another_packages_private_name():
    problems = _problems(_modules())
    assert not problems, "import rules broken:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "broken"),
    [
        ("from ckptspec.spec.protocol.test_failures import data_file\n", "imports the test module"),
        ("from ckptspec.spec.harness.ranks.forked import _job\n", "imports the private name(s) _job"),
    ],
)
def test_the_rules_catch_a_test_module_import_and_a_private_name(tmp_path, source, broken):
    offender = tmp_path / "offender.py"
    offender.write_text(source)
    modules = {k: v for k, v in _modules().items() if k.startswith("ckptspec.spec")}
    modules["ckptspec.faults.offender"] = offender
    problems = [p for p in _problems(modules) if "offender" in p]
    assert len(problems) == 1, problems
    assert broken in problems[0], problems


def _classes(modules: dict[str, Path]) -> dict[str, list[str]]:
    """Every class name defined in the modules, with where each is defined."""
    found: dict[str, list[str]] = {}
    for name, path in sorted(modules.items()):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                found.setdefault(node.name, []).append(f"{name}:{node.lineno}")
    return found


def test_no_two_classes_share_a_name():
    """One name per concept across the suite's packages (the standalone reproducers of findings/repro, which copy
    what they need, stand apart)."""
    shared = {name: where for name, where in _classes(_modules()).items() if len(where) > 1}
    assert not shared, "classes sharing a name (rename one):\n" + "\n".join(f"{n}: {w}" for n, w in shared.items())


def test_the_class_name_rule_sees_a_second_class_of_a_name(tmp_path):
    second = tmp_path / "second.py"
    second.write_text("class RankPool:\n    pass\n")
    modules = {**_modules(), "ckptspec.faults.second": second}
    where = _classes(modules)["RankPool"]
    assert len(where) == 2, where
    assert "ckptspec.faults.second:1" in where, where
