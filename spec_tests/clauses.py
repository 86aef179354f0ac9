"""The clause registry: `clauses.toml` parsed into {id: {"statement", "source", "decision"?}}."""

from __future__ import annotations

import functools
import tomllib
from pathlib import Path

__all__ = ["load"]

PATH = Path(__file__).with_name("clauses.toml")
_FIELDS = {"id", "statement", "source", "decision"}


@functools.cache
def load() -> dict[str, dict[str, str]]:
    registry: dict[str, dict[str, str]] = {}
    for entry in tomllib.loads(PATH.read_text())["clause"]:
        extra = set(entry) - _FIELDS
        if extra or not {"id", "statement", "source"} <= set(entry):
            raise ValueError(f"{PATH}: clause {entry.get('id')!r} has bad fields {sorted(set(entry) ^ _FIELDS)}")
        if entry["id"] in registry:
            raise ValueError(f"{PATH}: duplicate clause id {entry['id']!r}")
        registry[entry["id"]] = {k: v for k, v in entry.items() if k != "id"}
    return registry
