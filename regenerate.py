"""Every generated block of the docs, every findings page and the results page, regenerated from the committed data.

    python regenerate.py           rewrite the blocks and pages in place
    python regenerate.py --check   change nothing; exit 1 showing what differs from the committed text (CI)

The blocks, the file each lives in, and their data: the conformance table, the protocol table and the fault matrix
in `docs/results.md` (`conformance/all/*.json`, the stored runs of every target and release, ckptspec/spec and
ckptspec/faults), the benchmark summaries in `docs/benchmarks.md` (`ckptspec/bench/results/*.json`, and the GPU runs'
`conformance/gpu/<run>/bench/*.json`), the paired comparisons and sweeps there (`ckptspec/bench/results/paired/`,
`sweeps/`), the cost gate's detection runs in `docs/benchmarks-ci.md` (`ckptspec/bench/results/gate/`) and the mutation score
in `docs/spec-design.md` (`mutation/results.json`), the GPU runs' tables in `docs/gpu.md` (`conformance/gpu/<run>/`), Findings at a glance in `README.md` (the stored
runs, the clauses' `symptom`s and the usage rules of `findings/advice.toml`). Each block is made by its own module's command line
(`--update FILE`), exactly as the docs tell a reader to run it (`python regenerate.py --commands` prints them).
The findings pages `docs/findings/<target>-<release>.md` (and their HTML copies, which the results page links to), the maintainer reports `findings/repro/<target>-<release>/
<CLAUSE>.md` (with the reproducers' captured outputs) and the filterable page `docs/results.html` come from the
stored runs too (ckptspec.report.findings, ckptspec.report.repro_reports, ckptspec.report.report --html). `--check` makes everything in a
temporary directory and compares. Run it from the repository root.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from ckptspec.bench import impl_goals, paired_summary, sweep
from ckptspec.bench import summary as benchmark_summary
from ckptspec.faults import matrix
from ckptspec.report import findings, glance, releases, report, repro_reports
from ckptspec.spec.harness.surface import contract
from gpu_run import results as gpu_results
from mutation import summary as mutation_summary

ROOT = Path(__file__).resolve().parent
RUNS = "conformance/all"
# The stored runs by the release list (ckptspec/report/releases.py): impl and the releases judged on every
# clause area, then those judged on the protocol area only.
RELEASES = [releases.REFERENCE, *(r.name for r in releases.full_suite())]
PROTOCOL_ONLY = [r.name for r in releases.protocol_only()]
MANAGER_ONLY = [r.name for r in releases.manager_only()]  # in the manager table and every page, not the protocol's
EVERY = RELEASES + PROTOCOL_ONLY + MANAGER_ONLY
BENCHMARK_RUNS = ["cpu.json", *(f"cpu-{r.name}.json" for r in releases.benchmark_peers()), "goodput-cpu.json"]
# The stored paired comparisons, the cost gate's detection runs and the sweeps (each directory's JSON files, by name).
PAIRED_RUNS, GATE_RUNS, SWEEP_RUNS = (
    sorted(str(p.relative_to(ROOT)) for p in (ROOT / "ckptspec/bench/results" / kind).glob("*.json"))
    for kind in ("paired", "gate", "sweeps")
)
README = "README.md"
RESULTS = "docs/results.md"
BENCHMARKS = "docs/benchmarks.md"
BENCHMARKS_CI = "docs/benchmarks-ci.md"
DESIGN = "docs/spec-design.md"
GPU = "docs/gpu.md"
ADDING_A_TARGET = "docs/adding-a-target.md"
# The stored GPU runs whose GPU-selection verdicts docs/gpu.md tables, newest first, and the GPU benchmark runs.
GPU_RUNS = [
    "conformance/gpu/2026-11-27-h100-lease-2",
    "conformance/gpu/2026-11-27-h100",
    "conformance/gpu/2026-11-26-h200",
]
GPU_BENCHMARK_RUNS = [
    "conformance/gpu/2026-11-27-h100-lease-2/bench/bench-lease.json",
    "conformance/gpu/2026-11-27-h100-lease/bench/bench-lease.json",
    "conformance/gpu/2026-11-27-h100/bench/save.json",
]
RESULTS_PAGE = "docs/results.html"
FINDINGS = "docs/findings"
REPORTS = "findings/repro"  # the maintainer reports, <release>/<CLAUSE>.md beside each reproducer


def _runs(names: Sequence[str]) -> list[str]:
    return [f"{RUNS}/{name}.json" for name in names]


# block name -> (the file holding it, the command's main, its arguments before `--update FILE`); paths relative to
# the repository root.
BLOCKS: dict[str, tuple[str, Callable[[list[str]], object], list[str]]] = {
    "conformance": (
        RESULTS,
        report.main,
        [*_runs(RELEASES), "--areas", "async_ckpt", "storage", "local", "integrity"],
    ),
    "protocol": (
        RESULTS,
        report.main,
        [*_runs(RELEASES + PROTOCOL_ONLY), "--areas", "protocol", "--block", "protocol"],
    ),
    "manager": (
        RESULTS,
        report.main,
        [
            *_runs([releases.REFERENCE, releases.LOCAL_REFERENCE, *(r.name for r in releases.with_manager())]),
            "--areas",
            "manager",
            "--block",
            "manager",
        ],
    ),
    "faults": (RESULTS, matrix.main, _runs(RELEASES + PROTOCOL_ONLY)),
    "benchmarks": (BENCHMARKS, benchmark_summary.main, [f"ckptspec/bench/results/{name}" for name in BENCHMARK_RUNS]),
    "benchmarks-paired": (BENCHMARKS, paired_summary.main, [*PAIRED_RUNS, "--block", "paired"]),
    "benchmarks-sweep": (BENCHMARKS, sweep.main, ["table", *SWEEP_RUNS, "--block", "sweep"]),
    "benchmarks-goals": (BENCHMARKS, impl_goals.main, []),
    "benchmarks-gate": (BENCHMARKS_CI, paired_summary.main, [*GATE_RUNS, "--block", "gate"]),
    "mutation": (DESIGN, mutation_summary.main, []),
    "benchmarks-gpu": (BENCHMARKS, benchmark_summary.main, [*GPU_BENCHMARK_RUNS, "--block", "gpu"]),
    "gpu-results": (GPU, gpu_results.main, GPU_RUNS),
    "glance": (README, glance.main, _runs(EVERY)),
    "contract": (ADDING_A_TARGET, contract.main, []),
}
# The other generated files: (what it is, the command's main, its arguments with the output path last).
PAGES: dict[str, tuple[Callable[[list[str]], object], list[str]]] = {
    FINDINGS: (findings.main, [*_runs(EVERY), "--out"]),
    REPORTS: (repro_reports.main, [*_runs(EVERY), "--out"]),
    RESULTS_PAGE: (report.main, [*_runs(EVERY), "--html"]),
}
FILES = sorted({file for file, _, _ in BLOCKS.values()})


def command_line(name: str) -> str:
    """The command of a block (BLOCKS) or generated page (PAGES) as a reader types it."""
    if name in BLOCKS:
        file, main, args = BLOCKS[name]
        args = [*args, "--update", file]
    else:
        main, args = PAGES[name]
        args = [*args, name]
    return " ".join(["python", "-m", sys.modules[main.__module__].__name__, *args])


def regenerate(base: Path) -> None:
    """Rewrite every block and page below `base`: the repository root, or a copy of its generated files (the
    commands read their data from the working directory, the repository root)."""
    for name, (file, main, args) in BLOCKS.items():
        if main([*args, "--update", str(base / file)]) not in (None, 0):
            raise SystemExit(f"regenerate: the {name} block's command failed: {command_line(name)}")
    for name, (main, args) in PAGES.items():
        if main([*args, str(base / name)]) not in (None, 0):
            raise SystemExit(f"regenerate: {name} could not be made: {command_line(name)}")


def _generated(base: Path) -> list[Path]:
    """The generated files below `base`, relative to it."""
    pages = sorted(p.relative_to(base) for p in (base / FINDINGS).glob("*.*"))
    pages += sorted(p.relative_to(base) for p in (base / REPORTS).glob("*/*.md"))
    return [Path(f) for f in FILES] + [Path(RESULTS_PAGE)] + pages


def drifted() -> list[str]:
    """The diff lines of whatever committed text differs from what its command makes."""
    with tempfile.TemporaryDirectory(prefix="ckptspec-regenerate-") as tmp:
        made = Path(tmp)
        for file in FILES:
            (made / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / file, made / file)
        regenerate(made)
        diff: list[str] = []
        for relative in sorted(set(_generated(ROOT)) | set(_generated(made))):
            committed, fresh = ROOT / relative, made / relative
            before = committed.read_text().splitlines() if committed.exists() else []
            after = fresh.read_text().splitlines() if fresh.exists() else []
            diff += difflib.unified_diff(before, after, str(relative), "regenerated", n=0, lineterm="")
    return diff


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python regenerate.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block or page differs")
    parser.add_argument("--commands", action="store_true", help="print each block's and page's own command")
    args = parser.parse_args(argv)
    if args.commands:
        print("\n".join(command_line(name) for name in [*BLOCKS, *PAGES]))
        return 0
    if not args.check:
        regenerate(ROOT)
        return 0
    diff = drifted()
    if diff:
        print("\n".join(diff[:80]), file=sys.stderr)
        print("regenerate: generated text differs from its data; run: python regenerate.py, and commit the result")
        return 1
    pages = f"{FINDINGS}/, {REPORTS}/*/*.md and {RESULTS_PAGE}"
    print(f"regenerate: the blocks ({', '.join(BLOCKS)}), {pages} match their data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
