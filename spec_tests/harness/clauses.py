"""The clause registry: the TOML files of `spec_tests/clauses/` parsed into {id: {"statement", "source", "decision"?}}.

Every `*.toml` file of that directory but `areas.toml` is one clause area, named by its stem (today: async_ckpt,
the async core; storage, the writer, saver, metadata cache and MSC; local, local checkpointing; faults, the FI-*
clauses of the fault-injection suite). A new area is a new file there: nothing here changes.

A clause may state the weak level of another (`weakens = "AQ-7"`): what a target that misses the strict clause
must still do. The report then gives the strict clause's level per target (strict, weak or fails).

Order (the order of the conformance table): the areas listed in `areas.toml` (`areas = [...]`) first, in that
order, then any area file it does not list, by name. A listed area without its file is an error.
"""

from __future__ import annotations

import functools
import tomllib
from collections.abc import Mapping
from pathlib import Path

__all__ = ["AREAS", "DIRECTORY", "FILES", "ClauseError", "discover", "load", "weak_levels"]

DIRECTORY = Path(__file__).resolve().parent.parent / "clauses"
INDEX = "areas.toml"
_FIELDS = {"id", "statement", "source", "decision", "weakens"}


class ClauseError(ValueError):
    """A clause file or the area index is malformed; the message names the file."""


def _read(path: Path) -> dict:
    try:
        return tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ClauseError(f"{path}: {exc}") from None


def discover(directory: Path = DIRECTORY) -> tuple[Path, ...]:
    """The area files of `directory`, in table order (see the module docstring)."""
    files = {path.stem: path for path in directory.glob("*.toml") if path.name != INDEX}
    index = directory / INDEX
    listed = _read(index).get("areas", []) if index.exists() else []
    if not isinstance(listed, list) or not all(isinstance(a, str) for a in listed):
        raise ClauseError(f"{index}: `areas` must be a list of area names")
    missing = [area for area in listed if area not in files]
    if missing:
        raise ClauseError(f"{index}: no clause file for the listed area(s) {', '.join(missing)} in {directory}")
    return tuple(files[a] for a in listed) + tuple(files[a] for a in sorted(set(files) - set(listed)))


FILES = discover()
AREAS = tuple(path.stem for path in FILES)


@functools.cache
def load(areas: tuple[str, ...] = AREAS) -> dict[str, dict[str, str]]:
    """The clauses of `areas` (all by default), in table order. Raises ClauseError on a malformed file."""
    unknown = set(areas) - set(AREAS)
    if unknown:
        raise ClauseError(f"unknown clause areas {sorted(unknown)}; the areas are {', '.join(AREAS)}")
    registry: dict[str, dict[str, str]] = {}
    for path in (f for f in FILES if f.stem in areas):
        for entry in _read(path).get("clause", []):
            extra = set(entry) - _FIELDS
            if extra or not {"id", "statement", "source"} <= set(entry):
                raise ClauseError(f"{path}: clause {entry.get('id')!r} has bad fields {sorted(set(entry) ^ _FIELDS)}")
            if entry["id"] in registry:
                raise ClauseError(f"{path}: duplicate clause id {entry['id']!r}")
            registry[entry["id"]] = {k: v for k, v in entry.items() if k != "id"}
    for cid, clause in registry.items():
        strict = clause.get("weakens")
        if strict is not None and (strict not in registry or "weakens" in registry[strict]):
            raise ClauseError(f"clause {cid!r} weakens {strict!r}, which is not a strict clause of the same areas")
    return registry


def weak_levels(registry: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """{strict clause id: the id of its weak level} for the clauses that state one (field `weakens`)."""
    return {clause["weakens"]: cid for cid, clause in registry.items() if "weakens" in clause}
