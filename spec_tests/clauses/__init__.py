"""The clause registry: the TOML files of this package parsed into {id: {"statement", "source", "decision"?}}.

One file per area, loaded in the order of FILES (the order of the conformance table):
async_ckpt (async core), storage (writer, saver, metadata cache, MSC), local (local checkpointing),
faults (FI-*, the fault-injection suite).
"""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

__all__ = ["FILES", "load"]

FILES = tuple(Path(__file__).with_name(f"{area}.toml") for area in ("async_ckpt", "storage", "local", "faults"))
_FIELDS = {"id", "statement", "source", "decision"}


@functools.cache
def load() -> dict[str, dict[str, str]]:
    registry: dict[str, dict[str, str]] = {}
    for path in FILES:
        for entry in tomllib.loads(path.read_text()).get("clause", []):
            extra = set(entry) - _FIELDS
            if extra or not {"id", "statement", "source"} <= set(entry):
                raise ValueError(f"{path}: clause {entry.get('id')!r} has bad fields {sorted(set(entry) ^ _FIELDS)}")
            if entry["id"] in registry:
                raise ValueError(f"{path}: duplicate clause id {entry['id']!r}")
            registry[entry["id"]] = {k: v for k, v in entry.items() if k != "id"}
    return registry
