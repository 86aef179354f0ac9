"""Run cosmic-ray's mutants of `ckptspec/impl/` on a random sample, each judged by the tests, and record every outcome.

    python -m mutation.run --sample 200 --seed 17 --jobs 2      # what `nox -s mutation` runs

Contract: the source is copied to `mutants/tree-<n>` (one working copy per job, which cosmic-ray edits in place;
`mutants/` is git-ignored); each group of impl modules has its own targeted tests (one process, `-x`, the
derandomized `ci` hypothesis profile), which must pass unmutated; the sampled mutants run in random order, so
`mutation/results.json`, written after each mutant, is a uniform random sample even when the run is stopped early.

A mutant is first run against the tests that executed its lines in the unmutated run (mutation.coverage_map),
fastest first; only if they all pass is it run against its group's whole selection, which alone can call it
survived. A mutant at import-time code goes straight to the whole selection. A hang (the run's timeout) kills.
"""

from __future__ import annotations

import argparse
import ast
import difflib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cosmic_ray.plugins
from cosmic_ray.commands.init import init
from cosmic_ray.mutating import use_mutation
from cosmic_ray.work_db import WorkDB, use_db

from mutation import coverage_map, summary

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "mutants"
RESULTS = ROOT / "mutation" / "results.json"
COPIED = ("ckptspec", "mutation", "pyproject.toml", "conftest.py")
PYTEST = ["-x", "-q", "-n", "0", "-p", "no:randomly", "--impl", "impl"]


@dataclass(frozen=True)
class Group:
    """impl modules whose mutants survive only if their group's tests all pass."""

    name: str
    modules: tuple[str, ...]
    tests: tuple[str, ...]


ASYNC = "ckptspec/impl/async_ckpt/"
GROUPS = (
    Group(
        "async_core",
        (
            *(f"{ASYNC}{m}.py" for m in ("request", "callers", "calls_queue", "worker", "core", "torch_ckpt")),
            "ckptspec/impl/utils.py",
        ),
        ("ckptspec/spec/test_api_surface.py", "ckptspec/spec/async_ckpt"),
    ),
    Group(
        "storage",
        (
            *(
                f"{ASYNC}{m}.py"
                for m in (
                    "filesystem_async",
                    "state_dict_saver",
                    "storage",
                    "staging",
                    "cached_metadata_filesystem_reader",
                )
            ),
            "ckptspec/impl/integrity.py",
        ),
        ("ckptspec/spec/test_api_surface.py", "ckptspec/spec/storage", "ckptspec/spec/integrity"),
    ),
    Group(
        "local",
        (
            "ckptspec/impl/local/base_state_dict.py",
            "ckptspec/impl/local/basic_state_dict.py",
            "ckptspec/impl/local/ckpt_managers/base_manager.py",
            "ckptspec/impl/local/ckpt_managers/local_manager.py",
            "ckptspec/impl/local/replication/group_utils.py",
            "ckptspec/impl/local/replication/strategies.py",
        ),
        (
            "ckptspec/spec/test_api_surface.py",
            "ckptspec/spec/local",
            "ckptspec/spec/integrity",
            "ckptspec/faults/test_local_faults.py",
        ),
    ),
)
# Run for the coverage map too: a mutant is first tried against every test here that executed its lines.
MAPPED = (
    "ckptspec/spec/async_ckpt",
    "ckptspec/spec/storage",
    "ckptspec/spec/local",
    "ckptspec/spec/integrity",
    "ckptspec/spec/protocol",
    "ckptspec/spec/test_api_surface.py",
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


def fresh_tree(tree: Path) -> None:
    """Copy the sources the mutants edit into `tree` (replacing an earlier copy, by its exact path)."""
    if tree.exists():
        shutil.rmtree(tree)
    tree.mkdir(parents=True)
    for name in COPIED:
        src = ROOT / name
        if src.is_dir():
            shutil.copytree(src, tree / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, tree / name)


def tree_env(tree: Path) -> dict[str, str]:
    # No bytecode: a mutant written within the second its module was cached could be run from the stale cache.
    return {**os.environ, "HYPOTHESIS_PROFILE": "ci", "PYTHONPATH": str(tree), "PYTHONDONTWRITEBYTECODE": "1"}


def run_pytest(tree: Path, args: list[str], timeout_s: float) -> str:
    """'passed', 'failed' or 'timeout' for `python -m pytest *args` in `tree`; a timeout ends its process group."""
    cmd = [sys.executable, "-m", "pytest", *PYTEST, f"--timeout={int(timeout_s)}", *args]
    proc = subprocess.Popen(
        cmd, cwd=tree, env=tree_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True
    )
    try:
        return "passed" if proc.wait(timeout=timeout_s + 60) == 0 else "failed"
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the session pytest leads: its ranks and workers too
        proc.wait()
        return "timeout"


@dataclass
class Job:
    group: Group
    item: Any  # cosmic-ray's WorkItem (one MutationSpec)


def judge(job: Job, tree: Path, cmap: coverage_map.Map, group_seconds: float) -> dict:
    """Apply the mutant in `tree`, run the tests, restore the module; the result entry."""
    (spec,) = job.item.mutations
    module = str(spec.module_path)
    first, last = spec.start_pos[0], spec.end_pos[0]
    selected = cmap.tests_for(tree, module, first, last)
    entry: dict[str, Any] = {
        "group": job.group.name,
        "module": module,
        "operator": spec.operator_name,
        "occurrence": spec.occurrence,
        "line": first,
    }
    start = time.monotonic()
    operator = cosmic_ray.plugins.get_operator(spec.operator_name)()
    with use_mutation(tree / module, operator, spec.occurrence) as (original, mutated):
        if mutated is None:
            entry["outcome"] = "no_mutation"
        else:
            outcome, stage = "passed", "selected"
            if selected:
                budget = max(60.0, 3 * sum(cmap.durations.get(t, 60.0) for t in selected) + 30)
                outcome = run_pytest(tree, selected, budget)
            if outcome == "passed":  # the rest of the group: what the selection ran passed already
                stage = "group"
                rest = [arg for test in selected or () for arg in ("--deselect", test)]
                outcome = run_pytest(tree, [*job.group.tests, *rest], max(120.0, 3 * group_seconds + 60))
            entry["outcome"] = "survived" if outcome == "passed" else "killed"
            entry["by"] = f"{stage} ({len(selected) if selected is not None else 'import time'})"
            if outcome == "timeout":
                entry["by"] += ", timeout"
            diff = difflib.unified_diff(original.splitlines(), mutated.splitlines(), module, module, lineterm="")
            entry["diff"] = "\n".join(diff)
    entry["seconds"] = round(time.monotonic() - start, 1)
    return entry


def draw(groups: list[Group], sample: int, seed: int) -> tuple[list[Job], int, int]:
    """Every mutant of the groups' modules outside annotations; a seeded uniform sample of them (0: all)."""
    jobs: list[Job] = []
    annotations = 0
    for group in groups:
        db_path = WORK / f"{group.name}.sqlite"
        db_path.unlink(missing_ok=True)
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
        inside = [in_annotation(i, spans[str(i.mutations[0].module_path)]) for i in items]
        annotations += sum(inside)
        jobs += [Job(group, i) for i, skip in zip(items, inside, strict=True) if not skip]
    rng = random.Random(seed)
    drawn = rng.sample(jobs, sample) if 0 < sample < len(jobs) else rng.sample(jobs, len(jobs))
    return drawn, len(jobs), annotations


def judge_all(jobs: list[Job], trees: list[Path], cmap: coverage_map.Map, groups: list[Group], done) -> None:
    """Judge `jobs` in order, len(trees) at once; `done(n, entry)` is called under a lock as each one ends."""
    group_seconds = {g.name: sum(s for t, s in cmap.durations.items() if t.startswith(g.tests)) for g in groups}
    lock = threading.Lock()
    free = list(trees)

    def work(n: int, job: Job) -> None:
        with lock:
            tree = free.pop()
        try:
            entry = judge(job, tree, cmap, group_seconds[job.group.name])
        finally:
            with lock:
                free.append(tree)
        with lock:
            done(n, entry)
        print(
            f"[{n + 1}/{len(jobs)}] {entry['module']}:{entry['line']} {entry['operator']} -> {entry['outcome']} "
            f"{entry.get('by', '')} {entry['seconds']} s",
            flush=True,
        )

    with ThreadPoolExecutor(len(trees)) as pool:
        for future in [pool.submit(work, n, job) for n, job in enumerate(jobs)]:
            future.result()


def write_results(results: dict) -> None:
    tmp = RESULTS.with_suffix(".tmp")
    tmp.write_text(json.dumps(results, indent=1) + "\n")
    tmp.replace(RESULTS)


def _key(spec_or_entry) -> tuple[str, str, int]:
    if isinstance(spec_or_entry, dict):
        return (spec_or_entry["module"], spec_or_entry["operator"], int(spec_or_entry["occurrence"]))
    return (str(spec_or_entry.module_path), spec_or_entry.operator_name, spec_or_entry.occurrence)


def _changed_lines(diff: str) -> list[str]:
    """A diff's removed and added lines (its positions move when impl changes elsewhere)."""
    return [line for line in diff.splitlines()[2:] if line[:1] in "+-"]


def rejudge(groups: list[Group], trees: list[Path], only: list[str]) -> None:
    """Judge again, against the current tests, every survivor of results.json not listed as equivalent; the
    entries are replaced in place (marked `rejudged`). The mutants must still apply as they did (same diff)."""
    results = json.loads(RESULTS.read_text())
    equivalent = {(e["module"], int(e["line"]), e["operator"]) for e in summary.equivalent_entries()}
    every, _, _ = draw(groups, 0, results["seed"])
    by_key = {_key(job.item.mutations[0]): job for job in every}
    todo = [
        n
        for n, m in enumerate(results["mutants"])
        if m["outcome"] == "survived"
        and (m["module"], int(m["line"]), m["operator"]) not in equivalent
        and (not only or f"{m['module']}:{m['line']}" in only)
    ]
    map_file = WORK / "all.map.json"
    if not map_file.exists():
        sys.exit(f"{map_file} is missing: run mutation.run without --rejudge first")
    cmap = coverage_map.load(map_file)
    today = time.strftime("%Y-%m-%d", time.gmtime())

    def done(i: int, entry: dict) -> None:
        n = todo[i]
        old = results["mutants"][n]
        if _changed_lines(entry.get("diff", "")) != _changed_lines(old.get("diff", "")):
            print(f"{old['module']}:{old['line']} {old['operator']}: impl changed, it is another mutant now: kept")
            return
        results["mutants"][n] = {**entry, "rejudged": today}
        write_results(results)

    judge_all([by_key[_key(results["mutants"][n])] for n in todo], trees, cmap, groups, done)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sample", type=int, default=200, help="mutants drawn at random (0: all of them)")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--jobs", type=int, default=2, help="mutants judged at once, each in its own tree")
    parser.add_argument("--groups", nargs="*", default=[g.name for g in GROUPS])
    parser.add_argument(
        "--rejudge", action="store_true", help="judge the survivors of results.json again (after new tests)"
    )
    parser.add_argument("--only", nargs="*", default=[], help="with --rejudge: only these MODULE:LINE survivors")
    parser.add_argument(
        "--resume", action="store_true", help="keep results.json's mutants of this sample and judge the rest"
    )
    args = parser.parse_args(argv)
    groups = [g for g in GROUPS if g.name in args.groups]

    trees = [WORK / f"tree-{n}" for n in range(args.jobs)]
    for tree in trees:
        fresh_tree(tree)
    os.chdir(ROOT)  # cosmic-ray names module paths relative to the working directory, as the trees do
    if args.rejudge:
        rejudge(groups, trees, args.only)
        return
    sample, population, annotations = draw(groups, args.sample, args.seed)
    kept: list[dict] = []
    command = "nox -s mutation -- " + " ".join(argv if argv is not None else sys.argv[1:])
    if args.resume:
        before = json.loads(RESULTS.read_text())
        if (before["seed"], before["sampled"], before["population"]) != (args.seed, len(sample), population):
            # impl changed since (another population): the same seed now draws other mutants
            sys.exit("--resume: results.json is of another sample (seed, size, or impl's mutants)")
        kept, command = before["mutants"], before["command"]
        judged = {_key(m) for m in kept}
        sample = [job for job in sample if _key(job.item.mutations[0]) not in judged]
        cmap = coverage_map.load(WORK / "all.map.json")
    else:
        # Also the baseline: unmutated, every mapped test must pass. Two xdist workers: this run is the long one.
        baseline = ["-x", "-q", "-n", "2", "-p", "no:randomly", "--impl", "impl", "--timeout=300", *MAPPED]
        cmap = coverage_map.build("all", trees[0], baseline, tree_env(trees[0]), WORK)
        print(f"coverage map: {cmap.seconds:.0f} s, {len(cmap.durations)} tests", flush=True)
    results = {
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "command": command,
        "seed": args.seed,
        "population": population,
        "in_annotations": annotations,
        "sampled": len(sample) + len(kept),
        "tests": {g.name: list(g.tests) for g in groups},
        "mapped": list(MAPPED),
        "mutants": kept,
    }

    def done(n: int, entry: dict) -> None:
        results["mutants"].append(entry)
        write_results(results)

    judge_all(sample, trees, cmap, groups, done)


if __name__ == "__main__":
    main()
