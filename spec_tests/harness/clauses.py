"""The clause registry: the TOML files of this package parsed into {id: {"statement", "source", "decision"?}}.

One file per area, loaded in the order of FILES (the order of the conformance table):
async_ckpt (async core), storage (writer, saver, metadata cache, MSC), local (local checkpointing),
faults (FI-*, the fault-injection suite).
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

__all__ = ["AREAS", "FILES", "load"]

AREAS = ("async_ckpt", "storage", "local", "faults")
DIRECTORY = Path(__file__).resolve().parent.parent / "clauses"
FILES = tuple(DIRECTORY / f"{area}.toml" for area in AREAS)
_FIELDS = {"id", "statement", "source", "decision"}


@functools.cache
def load(areas: tuple[str, ...] = AREAS) -> dict[str, dict[str, str]]:
    """The clauses of `areas` (all by default), in FILES order."""
    unknown = set(areas) - set(AREAS)
    if unknown:
        raise ValueError(f"unknown clause areas {sorted(unknown)}; the areas are {', '.join(AREAS)}")
    registry: dict[str, dict[str, str]] = {}
    for path in (f for f in FILES if f.stem in areas):
        for entry in tomllib.loads(path.read_text()).get("clause", []):
            extra = set(entry) - _FIELDS
            if extra or not {"id", "statement", "source"} <= set(entry):
                raise ValueError(f"{path}: clause {entry.get('id')!r} has bad fields {sorted(set(entry) ^ _FIELDS)}")
            if entry["id"] in registry:
                raise ValueError(f"{path}: duplicate clause id {entry['id']!r}")
            registry[entry["id"]] = {k: v for k, v in entry.items() if k != "id"}
    return registry
