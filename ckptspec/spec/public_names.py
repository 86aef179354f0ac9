"""The public names of a release of ``nvidia_resiliency_ext.checkpointing``, read from its source with ``ast``.

A module's public names are those it defines at module level (functions, classes, assignments, also inside a
module-level ``if``/``try``) or lists in ``__all__``, without a leading underscore; names it merely imports are
the imported module's, not its own (except in a package's ``__init__.py``, whose imports are its re-exports).
A class's public attributes are the names its body defines and the ``self.NAME = ...`` assignments of its
``__init__``, without a leading underscore. Nothing is imported or run, so any release can be read on any Python.

``python -m ckptspec.spec.public_names --write ckptspec/spec/nvrx_api.toml WHEEL_DIR ...`` regenerates the released
names of the API manifest that ``ckptspec/spec/test_api_surface.py`` checks a target against (one table per release
found in the directories, e.g. after ``pip download --no-deps -d WHEEL_DIR nvidia-resiliency-ext==X``), keeping the
file's hand-written part above its ``GENERATED`` line; without ``--write`` it prints that part.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import re
import sys
import textwrap
import zipfile
from pathlib import Path

__all__ = ["GENERATED", "PACKAGE", "declared_attributes", "module_names", "release_names"]

PACKAGE = "nvidia_resiliency_ext/checkpointing/"
GENERATED = "# ---------------------------------------- generated below: do not edit by hand"
_WHEEL = re.compile(r"nvidia_resiliency_ext-([^-]+)-.*\.whl")


def _public(name: str) -> bool:
    return not name.startswith("_")


def _targets(node: ast.AST) -> list[str]:
    """The plain names bound by an assignment target (tuples unpacked; attributes and subscripts bind none)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [name for elt in node.elts for name in _targets(elt)]
    return []


def _bound(body: list[ast.stmt], imports: bool) -> list[tuple[str, ast.ClassDef | None]]:
    """(name, its class definition or None) of every name ``body`` binds, looking into if/try blocks (not defs)."""
    found: list[tuple[str, ast.ClassDef | None]] = []
    for stmt in body:
        if isinstance(stmt, (ast.If, ast.Try)):
            blocks = [stmt.body, stmt.orelse] + ([h.body for h in stmt.handlers] if isinstance(stmt, ast.Try) else [])
            for block in blocks:
                found += _bound(block, imports)
        elif isinstance(stmt, ast.ClassDef):
            found.append((stmt.name, stmt))
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            found.append((stmt.name, None))
        elif isinstance(stmt, ast.Assign):
            found += [(name, None) for target in stmt.targets for name in _targets(target)]
        elif isinstance(stmt, ast.AnnAssign):
            found += [(name, None) for name in _targets(stmt.target)]
        elif imports and isinstance(stmt, (ast.Import, ast.ImportFrom)):
            found += [((a.asname or a.name).split(".")[0], None) for a in stmt.names if a.name != "*"]
    return found


def _dunder_all(tree: ast.Module) -> list[str]:
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in stmt.targets):
            try:
                return [str(name) for name in ast.literal_eval(stmt.value)]
            except ValueError:
                return []
    return []


def _init_attributes(cls: ast.ClassDef) -> list[str]:
    """Names assigned as ``self.NAME`` in the class's own ``__init__``."""
    names: list[str] = []
    for stmt in cls.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name == "__init__" and stmt.args.args:
            me = stmt.args.args[0].arg
            for node in ast.walk(stmt):
                targets = node.targets if isinstance(node, ast.Assign) else []
                if isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                    targets = [node.target]
                for target in targets:
                    names.extend(
                        elt.attr
                        for elt in (target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target])
                        if isinstance(elt, ast.Attribute) and isinstance(elt.value, ast.Name) and elt.value.id == me
                    )
    return names


def _class_names(cls: ast.ClassDef) -> list[str]:
    names = [name for name, _ in _bound(cls.body, imports=False)] + _init_attributes(cls)
    return sorted({n for n in names if _public(n)})


def declared_attributes(cls: type) -> set[str]:
    """The public attributes ``cls`` and its bases declare in their source, by the rule above (instance attributes
    set in ``__init__`` and dataclass fields included, which ``hasattr`` on the class does not see)."""
    names: set[str] = set()
    for klass in cls.__mro__:
        try:
            source = textwrap.dedent(inspect.getsource(klass))
        except (OSError, TypeError):
            continue  # a builtin base
        names.update(n for node in ast.parse(source).body if isinstance(node, ast.ClassDef) for n in _class_names(node))
    return names


def module_names(source: str, is_package: bool = False) -> dict[str, list[str]]:
    """``{"": [module-level public names], "ClassName": [its public attributes], ...}`` of one module's source."""
    tree = ast.parse(source)
    top: set[str] = set(_dunder_all(tree))
    classes: dict[str, list[str]] = {}
    for name, cls in _bound(tree.body, imports=is_package):
        top.add(name)
        if cls is not None and _public(name):
            classes[name] = _class_names(cls)
    result = {"": sorted(n for n in top if _public(n))}
    result.update(sorted(classes.items()))
    return result


def release_names(wheel: Path) -> dict[str, dict[str, list[str]]]:
    """Module path below ``checkpointing`` (``""`` for the package itself) -> ``module_names`` of that module."""
    modules: dict[str, dict[str, list[str]]] = {}
    with zipfile.ZipFile(wheel) as archive:
        for member in sorted(archive.namelist()):
            if not (member.startswith(PACKAGE) and member.endswith(".py")):
                continue
            parts = member[len(PACKAGE) : -len(".py")].split("/")
            is_package = parts[-1] == "__init__"
            if is_package:
                parts = parts[:-1]
            if any(p.startswith("_") for p in parts):
                continue  # a private module: none of its names is public
            modules[".".join(parts)] = module_names(archive.read(member).decode(), is_package)
    return modules


def _quoted(name: str) -> str:
    return '"' + name + '"'  # identifiers only: nothing to escape


def _toml(releases: dict[str, dict[str, dict[str, list[str]]]]) -> str:
    lines = []
    for version, modules in releases.items():
        for module, names in modules.items():
            lines.append(f'\n[released."{version}"."{module}"]')
            lines += [f'"{key}" = [{", ".join(_quoted(n) for n in value)}]' for key, value in names.items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m ckptspec.spec.public_names", description=__doc__.split("\n")[0])
    parser.add_argument("wheel_dirs", nargs="+", type=Path, metavar="WHEEL_DIR", help="directories holding NVRx wheels")
    parser.add_argument("--write", type=Path, metavar="FILE", help="replace FILE's generated part (below its marker)")
    args = parser.parse_args(argv)
    releases = {}
    for directory in args.wheel_dirs:
        for wheel in sorted(directory.glob("nvidia_resiliency_ext-*.whl")):
            match = _WHEEL.fullmatch(wheel.name)
            if match:
                releases[match[1]] = release_names(wheel)
    if not releases:
        parser.error("no nvidia_resiliency_ext-*.whl in " + ", ".join(map(str, args.wheel_dirs)))
    generated = _toml(dict(sorted(releases.items())))
    if args.write is None:
        sys.stdout.write(generated)
        return
    kept, marker, _ = args.write.read_text().partition(GENERATED)
    if not marker:
        parser.error(f"{args.write} has no line {GENERATED!r} to write below")
    args.write.write_text(kept + GENERATED + "\n" + generated)


if __name__ == "__main__":
    main(sys.argv[1:])
