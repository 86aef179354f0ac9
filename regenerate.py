"""Every generated block of the README and every findings page, regenerated from the committed data.

    python regenerate.py           rewrite the blocks and pages in place
    python regenerate.py --check   change nothing; exit 1 showing what differs from the committed text (CI)

The blocks and their data: the conformance table and the protocol table (`conformance/all/*.json`, the stored runs
of every target and release, spec_tests and fault_injection), the fault matrix (the same files), the benchmark
summary (`benchmarks/results/*.json`) and the mutation score (`mutation/results.json`). Each block is made by its
own module's command line (`--update FILE`), exactly as the README tells a reader to run it. The findings pages
`docs/findings/<target>-<release>.md` come from the stored runs (spec_tests.harness.findings). `--check` makes
everything in a temporary directory and compares.
"""

from __future__ import annotations

import argparse
import difflib
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from benchmarks import summary as benchmark_summary
from fault_injection import matrix
from mutation import summary as mutation_summary
from spec_tests.harness import findings, report

ROOT = Path(__file__).resolve().parent
RUNS = "conformance/all"
RELEASES = ["impl", "nvrx-0.4.1", "nvrx-0.7.0", "mcore-0.16.1", "mcore-0.19.2"]
PROTOCOL_ONLY = ["dcp-thread", "dcp-process", "dcp-staged"]
BENCHMARK_RUNS = ["cpu.json", "cpu-nvrx-0.7.0.json", "cpu-mcore-0.19.2.json", "goodput-cpu.json"]


def _runs(names: Sequence[str]) -> list[str]:
    return [f"{RUNS}/{name}.json" for name in names]


# block name -> (the command's main, its arguments before `--update FILE`); paths relative to the repository root.
BLOCKS: dict[str, tuple[Callable[[list[str]], object], list[str]]] = {
    "conformance": (report.main, [*_runs(RELEASES), "--areas", "async_ckpt", "storage", "local", "integrity"]),
    "protocol": (report.main, [*_runs(RELEASES + PROTOCOL_ONLY), "--areas", "protocol", "--block", "protocol"]),
    "faults": (matrix.main, _runs(RELEASES + PROTOCOL_ONLY)),
    "benchmarks": (benchmark_summary.main, [f"benchmarks/results/{name}" for name in BENCHMARK_RUNS]),
    "mutation": (mutation_summary.main, []),
}


def command_line(name: str, readme: str = "README.md") -> str:
    """The block's command as a reader types it."""
    main, args = BLOCKS[name]
    module = sys.modules[main.__module__].__name__
    return " ".join(["python", "-m", module, *args, "--update", readme])


FINDINGS = ROOT / "docs" / "findings"


def regenerate(readme: Path, findings_dir: Path) -> None:
    """Rewrite every block of `readme` and the findings pages in `findings_dir` (run from the repository root)."""
    for name, (main, args) in BLOCKS.items():
        status = main([*args, "--update", str(readme)])
        if status not in (None, 0):
            raise SystemExit(f"regenerate: the {name} block's command failed: {command_line(name)}")
    if findings.main([*_runs(RELEASES + PROTOCOL_ONLY), "--out", str(findings_dir)]) != 0:
        raise SystemExit("regenerate: the findings pages could not be made")


def drifted(readme: Path, findings_dir: Path) -> list[str]:
    """The diff lines of whatever committed text differs from what its command makes."""
    with tempfile.TemporaryDirectory(prefix="ckptspec-regenerate-") as tmp:
        copy, pages = Path(tmp) / readme.name, Path(tmp) / "findings"
        shutil.copyfile(readme, copy)
        regenerate(copy, pages)
        pairs = [(readme, copy)] + [(findings_dir / page.name, page) for page in sorted(pages.glob("*.md"))]
        pairs += [
            (page, pages / page.name) for page in sorted(findings_dir.glob("*.md")) if not (pages / page.name).exists()
        ]
        diff: list[str] = []
        for committed, made in pairs:
            before = committed.read_text().splitlines() if committed.exists() else []
            after = made.read_text().splitlines() if made.exists() else []
            diff += difflib.unified_diff(
                before, after, str(committed.relative_to(ROOT)), "regenerated", n=0, lineterm=""
            )
    return diff


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python regenerate.py", description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs")
    args = parser.parse_args(argv)
    readme = ROOT / "README.md"
    if not args.check:
        regenerate(readme, FINDINGS)
        return 0
    diff = drifted(readme, FINDINGS)
    if diff:
        print("\n".join(diff[:80]), file=sys.stderr)
        print("regenerate: generated text differs from its data; run: python regenerate.py, and commit the result")
        return 1
    print(f"regenerate: the README's blocks ({', '.join(BLOCKS)}) and docs/findings/ match their data")
    return 0


if __name__ == "__main__":
    sys.exit(main())
