"""The clause registry: the TOML files of `ckptspec/spec/clauses/` parsed into {id: {"statement", "symptom", "basis",
"severity", "source", "decision"?, "weakens"?}}.

Every `*.toml` file of that directory but `areas.toml` is one clause area, named by its stem (today: async_ckpt,
the async core; storage, the writer, saver, metadata cache and MSC; local, local checkpointing; faults, the FI-*
clauses of the fault-injection suite). A new area is a new file there: nothing here changes.

Every clause states its provenance and what missing it costs (issue 30):

- `symptom`: what a user sees or loses when a target breaks the clause, in a few plain words, starting lowercase and
  without a trailing period (for a weak level: what even the weak level's miss costs). It is true of any target
  that breaks the clause, not one release's mechanism; it is the "what goes wrong" of a findings table.

- `basis`: "documented" (a document says it: `source` names the seed file, or a release's own docstring with its
  version, and quotes the sentence), "implied" (code or a docstring implies it: `source` names it and says how) or
  "decision" (the documents leave it open: `decision` gives the reason, `source` the anchor it follows, such as
  torch DCP, Orbax or this spec). A clause of basis "decision" must have a `decision` text; any clause may have one
  to explain a detail the spec chose (a bound, an exception type).
- `severity`: what a user suffers when a target misses the clause: "data-loss" (a wrong, partial or missing
  checkpoint reported as good, a lost save, a snapshot of the wrong data), "hang" (a call waits forever or past its
  bound), "leak" (processes, files, memory or descriptors left behind), "wrong-error" (a wrong exception or message,
  an error that surfaces late or on the wrong rank, no data lost) or "cosmetic" (API shape, return types, names).

- `snapshot = true`: the clause judges the values of tensors a save captured (the snapshot family); the report says
  which device those tensors were on (a CPU-tensor verdict is not a GPU one).
A missing or unknown `basis` or `severity`, or a missing or empty `symptom`, is a ClauseError naming the file and
the clause.

A clause may state the weak level of another (`weakens = "AQ-7"`): what a target that misses the strict clause
must still do. The report then gives the strict clause's level per target (strict, weak or fails). A strict clause
of severity data-loss or hang that a judged release breaks has a weak level, or says in `no_weak_level` why none
applies (the findings pages show which, and "none yet" otherwise): an expected failure must not hide a worse one.

Order (the order of the conformance table): the areas listed in `areas.toml` (`areas = [...]`) first, in that
order, then any area file it does not list, by name. A listed area without its file is an error.
"""

from __future__ import annotations

import functools
import re
import tomllib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "AREAS",
    "BASES",
    "DIRECTORY",
    "FILES",
    "SEEDS",
    "SEVERITIES",
    "ClauseError",
    "area_of",
    "check_levels",
    "discover",
    "linked_source",
    "load",
    "markdown_source",
    "read_area",
    "seeds_key_markdown",
    "weak_levels",
]

DIRECTORY = Path(__file__).resolve().parents[1] / "spec" / "clauses"
SEEDS = {
    "000": (
        "NVRx, async checkpointing: usage guide",
        "https://nvidia.github.io/nvidia-resiliency-ext/checkpointing/async/usage_guide.html",
    ),
    "001": (
        "NVRx, local checkpointing: usage guide",
        "https://nvidia.github.io/nvidia-resiliency-ext/checkpointing/local/usage_guide.html",
    ),
    "002": (
        "Megatron-Core API: core.dist_checkpointing.strategies.async_utils",
        "https://docs.nvidia.com/megatron-core/developer-guide/latest/apidocs/core/core.dist_checkpointing.strategies.async_utils.html",
    ),
    "003": (
        "NVRx source: nvidia_resiliency_ext.checkpointing.async_ckpt.state_dict_saver",
        "https://nvidia.github.io/nvidia-resiliency-ext/_modules/nvidia_resiliency_ext/checkpointing/async_ckpt/state_dict_saver.html",
    ),
    "004": (
        "PyTorch recipe: asynchronous saving with distributed checkpoint (DCP)",
        "https://docs.pytorch.org/tutorials/recipes/distributed_async_checkpoint_recipe.html",
    ),
}
"""The documents the clauses are specified from, by the number a clause's `source` cites them with (the files
shared/seeds/NNN_*.txt of this project's material): a title and the public page each is a copy of."""
_SEED_CITED = re.compile(r"(?<![\w.])(00\d)(?![\w.])")


def linked_source(source: str, link: Callable[[str, str, str], str]) -> str:
    """`source` with each seed number it cites (`002 AsyncRequest: ...`) made a link by `link(number, title, url)`
    (Markdown or HTML, the caller's format); other text, and numbers that name no seed, unchanged."""

    def one(match: re.Match[str]) -> str:
        seed = SEEDS.get(match.group(1))
        return link(match.group(1), *seed) if seed else match.group(0)

    return _SEED_CITED.sub(one, source)


def markdown_source(source: str) -> str:
    """`source` with its seed numbers as Markdown links (the findings pages, the maintainer reports)."""
    return linked_source(source, lambda number, title, url: f'[{number}]({url} "{title}")')


def seeds_key_markdown() -> list[str]:
    """The key of the seed numbers, one Markdown line each, for the foot of a page that cites them."""
    return [f"- **{number}**: [{title}]({url})" for number, (title, url) in SEEDS.items()]


INDEX = "areas.toml"
_FIELDS = {
    "id",
    "statement",
    "symptom",
    "basis",
    "severity",
    "source",
    "decision",
    "weakens",
    "snapshot",
    "no_weak_level",
    "severity_reason",  # a weak level more severe than its strict clause says why (harness_tests/test_consistency)
}
_REQUIRED = {"id", "statement", "symptom", "basis", "severity", "source"}
BASES = ("documented", "implied", "decision")
SEVERITIES = ("data-loss", "hang", "leak", "wrong-error", "cosmetic")


class ClauseError(ValueError):
    """A clause file or the area index is malformed; the message names the file."""


def _read(path: Path) -> dict[str, Any]:
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


def _check(path: Path, entry: object) -> dict[str, str]:
    if not isinstance(entry, dict):
        raise ClauseError(f"{path}: a [[clause]] entry must be a table")
    cid = entry.get("id")
    extra, missing = set(entry) - _FIELDS, _REQUIRED - set(entry)
    if extra:
        raise ClauseError(f"{path}: clause {cid!r} has unknown field(s) {', '.join(sorted(extra))}")
    if missing:
        raise ClauseError(f"{path}: clause {cid!r} lacks the required field(s) {', '.join(sorted(missing))}")
    for name, allowed in (("basis", BASES), ("severity", SEVERITIES)):
        if entry[name] not in allowed:
            raise ClauseError(
                f"{path}: clause {cid!r} has {name} {entry[name]!r}; it must be one of {', '.join(allowed)}"
            )
    if entry.get("snapshot", True) is not True:
        raise ClauseError(
            f"{path}: clause {cid!r} has snapshot {entry['snapshot']!r}; only `snapshot = true` is allowed"
        )
    if not isinstance(entry["symptom"], str) or not entry["symptom"].strip():
        raise ClauseError(f"{path}: clause {cid!r} has no `symptom` text; say what a user sees when a target breaks it")
    if entry["basis"] == "decision" and not str(entry.get("decision", "")).strip():
        raise ClauseError(f"{path}: clause {cid!r} has basis 'decision' but no `decision` text giving the reason")
    return entry


def read_area(path: Path) -> list[dict[str, str]]:
    """The clauses of one area file, each checked (fields, symptom, basis, severity). Raises ClauseError naming file
    and clause."""
    return [_check(path, entry) for entry in _read(path).get("clause", [])]


def check_levels(registry: Mapping[str, Mapping[str, Any]]) -> None:
    """Refuse (ClauseError) a weak level of no strict clause of `registry`, and `no_weak_level` on a weak level or on
    a strict clause that has one."""
    for cid, clause in registry.items():
        strict = clause.get("weakens")
        if strict is not None and (strict not in registry or "weakens" in registry[strict]):
            raise ClauseError(f"clause {cid!r} weakens {strict!r}, which is not a strict clause of the same areas")
        if strict is not None and "no_weak_level" in registry[strict]:
            raise ClauseError(f"clause {strict!r} says why it has no weak level (no_weak_level), but {cid!r} is one")
        if "no_weak_level" in clause and (strict is not None or not str(clause["no_weak_level"]).strip()):
            raise ClauseError(f"clause {cid!r}: `no_weak_level` is a strict clause's reason why no weak level applies")


@functools.cache
def load(areas: tuple[str, ...] = AREAS) -> dict[str, dict[str, str]]:
    """The clauses of `areas` (all by default), in table order. Raises ClauseError on a malformed file."""
    unknown = set(areas) - set(AREAS)
    if unknown:
        raise ClauseError(f"unknown clause areas {sorted(unknown)}; the areas are {', '.join(AREAS)}")
    registry: dict[str, dict[str, str]] = {}
    for path in (f for f in FILES if f.stem in areas):
        for entry in read_area(path):
            if entry["id"] in registry:
                raise ClauseError(f"{path}: duplicate clause id {entry['id']!r}")
            registry[entry["id"]] = {k: v for k, v in entry.items() if k != "id"}
    check_levels(registry)
    return registry


def area_of(clause_id: str) -> str | None:
    """The area whose file states `clause_id` (its file's stem: "async_ckpt", "protocol", ...), or None."""
    return next((area for area in AREAS if clause_id in load((area,))), None)


def weak_levels(registry: Mapping[str, Mapping[str, str]]) -> dict[str, str]:
    """{strict clause id: the id of its weak level} for the clauses that state one (field `weakens`)."""
    return {clause["weakens"]: cid for cid, clause in registry.items() if "weakens" in clause}
