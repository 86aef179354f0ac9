"""What to do: the usage rules of `findings/advice.toml`, and the stored releases each applies to.

A rule names the libraries it is for, what to do, why (the findings in the user's words), the safe alternative and
the clauses it comes from. It applies to a stored run of one of its libraries when that run breaks one of its
clauses (any broken word: documented, implied, or this spec's decision) or meets only their weak level. `load`
refuses a file with a missing or unknown field, an unknown library or an unknown clause, naming the rule.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ckptspec.report import installed
from ckptspec.report.report import clause_verdict
from ckptspec.report.runs import ReportError, Run

__all__ = ["ADVICE", "LIBRARIES", "Rule", "applies", "for_run", "library_of", "load"]

ADVICE = installed.data_file("findings/advice.toml")
# library key -> (its name for readers, the run targets it covers)
LIBRARIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "nvrx": ("NVRx", ("nvrx",)),
    "mcore": ("Megatron-Core", ("mcore",)),
    "dcp": ("torch DCP", ("dcp-thread", "dcp-process", "dcp-staged")),
    "torchtitan": ("torchtitan", ("torchtitan",)),
    "lightning": ("Lightning", ("lightning",)),
    "deepspeed": ("DeepSpeed", ("deepspeed", "deepspeed-decoupled")),
    "olmo-core": ("OLMo-core", ("olmo-core",)),
    "transformers": ("the transformers Trainer", ("transformers",)),
    "torch-checkpointing": ("torch_checkpointing", ("torch-checkpointing", "torch-checkpointing-buffered")),
}
_FIELDS = ("libraries", "rule", "because", "instead", "clauses")


@dataclass(frozen=True)
class Rule:
    libraries: tuple[str, ...]
    rule: str
    because: str
    instead: str
    clauses: tuple[str, ...]


def library_of(run: Run) -> str | None:
    """The library key of a run's target (None for impl and unknown targets)."""
    target = run.label.split()[0]
    return next((key for key, (_, targets) in LIBRARIES.items() if target in targets), None)


def _rule(index: int, entry: Any, registry: Mapping[str, Any]) -> Rule:
    where = f"findings/advice.toml rule {index + 1}"
    if not isinstance(entry, dict) or set(entry) != set(_FIELDS):
        fields = sorted(entry) if isinstance(entry, dict) else entry
        raise ReportError(f"{where}: needs exactly the fields {', '.join(_FIELDS)} (has {fields})")
    for key in ("rule", "because", "instead"):
        if not isinstance(entry[key], str) or not entry[key].strip():
            raise ReportError(f"{where}: {key!r} must be a non-empty string")
    for key in ("libraries", "clauses"):
        if not isinstance(entry[key], list) or not entry[key] or not all(isinstance(v, str) for v in entry[key]):
            raise ReportError(f"{where}: {key!r} must be a non-empty list of strings")
    unknown = [lib for lib in entry["libraries"] if lib not in LIBRARIES]
    if unknown:
        raise ReportError(f"{where} ({entry['rule']!r}): unknown libraries {unknown}; known: {sorted(LIBRARIES)}")
    missing = [cid for cid in entry["clauses"] if cid not in registry]
    if missing:
        raise ReportError(f"{where} ({entry['rule']!r}): unknown clauses {missing}")
    return Rule(tuple(entry["libraries"]), entry["rule"], entry["because"], entry["instead"], tuple(entry["clauses"]))


def load(registry: Mapping[str, Any], path: Path = ADVICE) -> list[Rule]:
    """The rules of `path`, checked against the clause registry (ReportError naming the rule if one is bad)."""
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ReportError(f"{path}: {exc}") from exc
    return [_rule(i, entry, registry) for i, entry in enumerate(data.get("rule", []))]


def applies(rule: Rule, run: Run, registry: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The clauses of `rule` that `run` misses (Verdict.missed: broken, weak level only, or failing on some runs;
    empty: the rule does not apply)."""
    if library_of(run) not in rule.libraries:
        return []
    return [cid for cid in rule.clauses if clause_verdict(run, cid, registry).missed]


def for_run(rules: Sequence[Rule], run: Run, registry: Mapping[str, Mapping[str, Any]]) -> list[tuple[Rule, list[str]]]:
    """The rules that apply to `run`, each with the clauses that make it apply, in the file's order."""
    return [(rule, cids) for rule in rules if (cids := applies(rule, run, registry))]
