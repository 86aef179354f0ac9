"""Run cosmic-ray over `impl/`, on a random sample of its mutants, and record every outcome.

    python -m mutation.run --sample 200 --seed 17        # what `nox -s mutation` runs

Contract: the source is copied to `mutants/tree` (the working copy cosmic-ray edits in place; `mutants/` is
git-ignored), each group of impl modules gets its own cosmic-ray session (`mutants/<group>.sqlite`) and its own
targeted tests (one process, `-x`, the derandomized `ci` hypothesis profile), the unmutated tests must pass
first, and the sampled mutants run in random order, so the results written after each mutant
(`mutation/results.json`) are a uniform random sample even when the run is stopped early.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cosmic_ray.commands.init import init
from cosmic_ray.mutating import mutate_and_test
from cosmic_ray.work_db import WorkDB, use_db
from cosmic_ray.work_item import WorkerOutcome

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "mutants"
TREE = WORK / "tree"
RESULTS = ROOT / "mutation" / "results.json"
COPIED = ("impl", "spec_tests", "pyproject.toml", "conftest.py")
PYTEST = [sys.executable, "-m", "pytest", "-x", "-q", "-n", "0", "-p", "no:randomly", "--impl", "impl"]


@dataclass(frozen=True)
class Group:
    """impl modules whose mutants one targeted test selection judges."""

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]


ASYNC = "impl/async_ckpt/"
GROUPS = (
    Group(
        "async_core",
        tuple(f"{ASYNC}{m}.py" for m in ("request", "callers", "calls_queue", "worker", "core", "torch_ckpt"))
        + ("impl/utils.py",),
        (
            "spec_tests/async_ckpt/test_request.py",
            "spec_tests/async_ckpt/test_workers.py",
            "spec_tests/async_ckpt/test_torch_ckpt.py",
            "spec_tests/async_ckpt/test_queue.py",
        ),
    ),
    Group(
        "storage",
        tuple(
            f"{ASYNC}{m}.py"
            for m in ("filesystem_async", "state_dict_saver", "storage", "staging", "cached_metadata_filesystem_reader")
        ),
        ("spec_tests/storage",),
    ),
    Group(
        "local",
        (
            "impl/local/base_state_dict.py",
            "impl/local/basic_state_dict.py",
            "impl/local/ckpt_managers/base_manager.py",
            "impl/local/ckpt_managers/local_manager.py",
            "impl/local/replication/group_utils.py",
            "impl/local/replication/strategies.py",
        ),
        ("spec_tests/local",),
    ),
)


def annotation_spans(module: str) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """(start, end) positions of the module's annotations: with `from __future__ import annotations` they are
    never evaluated, so a mutant inside one is equivalent by construction and is not drawn."""
    spans = []
    for node in ast.walk(ast.parse(Path(module).read_text())):
        notes = []
        if isinstance(node, ast.arg | ast.AnnAssign) and node.annotation is not None:
            notes.append(node.annotation)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.returns is not None:
            notes.append(node.returns)
        spans += [((n.lineno, n.col_offset), (n.end_lineno or n.lineno, n.end_col_offset or 0)) for n in notes]
    return spans


def in_annotation(item, spans) -> bool:
    (spec,) = item.mutations
    return any(start <= tuple(spec.start_pos) < end for start, end in spans)


def fresh_tree() -> None:
    """Copy the sources cosmic-ray will edit into TREE (replacing an earlier copy, by its exact path)."""
    if TREE.exists():
        shutil.rmtree(TREE)
    TREE.mkdir(parents=True)
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, TREE / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, TREE / name)


def test_command(group: Group, timeout_s: int) -> list[str]:
    return [*PYTEST, f"--timeout={timeout_s}", *group.tests]


def baseline(group: Group) -> float:
    """Run the group's tests on the unmutated copy; they must pass. Returns the wall time."""
    start = time.monotonic()
    proc = subprocess.run(test_command(group, 300), cwd=TREE, capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"{group.name}: tests fail without a mutant:\n{proc.stdout[-4000:]}")
    return time.monotonic() - start


def record(entry: dict, results: list[dict], meta: dict) -> None:
    results.append(entry)
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps({**meta, "mutants": results}, indent=1) + "\n")
    tmp.replace(RESULTS)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=200, help="mutants drawn at random (0: all of them)")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--groups", nargs="*", default=[g.name for g in GROUPS])
    args = parser.parse_args(argv)
    groups = [g for g in GROUPS if g.name in args.groups]

    fresh_tree()
    os.chdir(TREE)  # cosmic-ray edits module paths relative to the working directory
    os.environ.update(HYPOTHESIS_PROFILE="ci", PYTHONPATH=str(TREE))
    jobs: list[tuple[Group, Any]] = []
    annotations = 0
    for group in groups:
        db_path = WORK / f"{group.name}.sqlite"
        if db_path.exists():
            db_path.unlink()
        with use_db(str(db_path), WorkDB.Mode.create) as db:
            init([Path(m) for m in group.modules], db, {})
            items = sorted(
                db.work_items,
                key=lambda i: (
                    str(i.mutations[0].module_path),
                    i.mutations[0].operator_name,
                    i.mutations[0].occurrence,
                ),
            )
            spans = {m: annotation_spans(m) for m in group.modules}
            annotations += sum(in_annotation(i, spans[str(i.mutations[0].module_path)]) for i in items)
            jobs += [(group, i) for i in items if not in_annotation(i, spans[str(i.mutations[0].module_path)])]
    population = len(jobs)
    rng = random.Random(args.seed)
    sample = rng.sample(jobs, args.sample) if 0 < args.sample < population else rng.sample(jobs, population)

    timeouts: dict[str, int] = {}  # from each group's unmutated run, taken when its first mutant comes up
    meta = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": "nox -s mutation -- " + " ".join(argv if argv is not None else sys.argv[1:]),
        "seed": args.seed,
        "population": population,
        "in_annotations": annotations,
        "sampled": len(sample),
        "tests": {g.name: list(g.tests) for g in groups},
    }
    results: list[dict] = []
    for n, (group, item) in enumerate(sample, 1):
        if group.name not in timeouts:
            took = baseline(group)
            timeouts[group.name] = int(max(120, 3 * took))
            print(f"baseline {group.name}: {took:.0f} s, mutant timeout {timeouts[group.name]} s", flush=True)
        command = " ".join(test_command(group, timeouts[group.name]))
        start = time.monotonic()
        result = mutate_and_test(item.mutations, command, timeouts[group.name] + 30)
        (spec,) = item.mutations
        outcome = "killed" if result.is_killed else "survived"
        if result.worker_outcome != WorkerOutcome.NORMAL:  # no mutation possible, or cosmic-ray failed
            outcome = str(result.worker_outcome.value)
        entry = {
            "group": group.name,
            "module": str(spec.module_path),
            "operator": spec.operator_name,
            "occurrence": spec.occurrence,
            "line": spec.start_pos[0],
            "outcome": outcome,
            "seconds": round(time.monotonic() - start, 1),
        }
        if outcome != "killed":
            entry["diff"] = result.diff
        record(entry, results, meta)
        print(f"[{n}/{len(sample)}] {entry['module']}:{entry['line']} {spec.operator_name} -> {outcome}", flush=True)


if __name__ == "__main__":
    main()
