"""The steps of the reusable conformance workflow (.github/workflows/conformance.yml), runnable anywhere.

    python -m ckptspec.spec.harness.ci_job run --adapter MODULE --out DIR [--areas AREA ...] [-n N] [-- PYTEST_ARGS]
    python -m ckptspec.spec.harness.ci_job summary RUN.json [--areas AREA ...] [--stored DIR] [--beside STORED.json ...]
                                                [--expectations FILE] [--out FILE]

`run` runs the suite's areas (those of `ckptspec judge --areas`; default: protocol and the fault suite) against the
adapter, from a checkout or an installed copy (ckptspec/report/installed.py), with the expectations the adapter
names or $CKPTSPEC_EXPECTATIONS, and records DIR/run.json. Its exit status is pytest's: 0 when every test passed or
failed as its expectations entry says, 1 on a new failure or a fixed one (a strict XPASS), so that the job turns red.

`summary` writes Markdown for a job summary: the run's counts, the verdict table of the clause areas asked for
(with stored runs as more columns: with --stored DIR, a checkout's conformance/all, the reference implementation's and
the newest release's of each target judged on those areas, read from the release list; with --beside, the files
named), each unexpected outcome with the clauses it cites and
its message's first line, and the `record_failures --new` stubs of the failures no entry covers, to paste into the
expectations file. It appends to FILE, by default $GITHUB_STEP_SUMMARY where that is set, else prints.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ckptspec.report import clauses as clause_registry
from ckptspec.report import installed, releases, report
from ckptspec.report.run_file import RunFile
from ckptspec.report.runs import load_run
from ckptspec.spec.harness import expectations, record_failures

__all__ = ["DEFAULT_AREAS", "area_paths", "main", "stored_runs", "summary"]

DEFAULT_AREAS = ("protocol", "faults")
# The areas of `ckptspec judge --areas` (cli.AREA_PATHS), by the paths they run.
_AREA_PATHS = {
    **{area: (f"ckptspec/spec/{area}",) for area in clause_registry.AREAS if area != "faults"},
    "faults": ("ckptspec/faults",),
    "api": ("ckptspec/spec/test_api_surface.py", "ckptspec/spec/test_nvrx_helpers.py"),
}
_UNEXPECTED = ("failed", "error", "xpass")
_MESSAGE_CHARS = 200


def area_paths(areas: Sequence[str]) -> list[str]:
    """The absolute paths the areas run (ValueError naming an unknown area)."""
    unknown = sorted(set(areas) - set(_AREA_PATHS))
    if unknown:
        raise ValueError(f"unknown areas {', '.join(unknown)}; known: {', '.join(sorted(_AREA_PATHS))}")
    return [str(installed.ROOT / path) for area in areas for path in _AREA_PATHS[area]]


def stored_runs(directory: Path, areas: Sequence[str]) -> list[Path]:
    """The stored runs a run is shown beside: the reference's, then the newest release's of each target judged on any
    of `areas` (releases.newest), in `directory`. FileNotFoundError naming the first one missing."""
    names = [releases.REFERENCE, *(release.name for release in releases.newest(tuple(areas)))]
    paths = [directory / f"{name}.json" for name in names]
    missing = [path for path in paths if not path.is_file()]
    if missing:
        raise FileNotFoundError(
            f"--stored {directory}: no stored run {missing[0].name} (expected: a checkout's conformance/all)"
        )
    return paths


def _run(args: argparse.Namespace) -> int:
    args.out.mkdir(parents=True, exist_ok=True)
    json_path = (args.out / "run.json").resolve()
    command = [sys.executable, "-m", "pytest", *installed.pytest_options(anywhere=True), *area_paths(args.areas)]
    command += ["-n", args.n, "-q", "-p", "no:randomly", "--impl", args.adapter, "--conformance-json", str(json_path)]
    command += args.pytest_args
    print("+ " + " ".join(command[1:]), flush=True)
    code = subprocess.run(command, check=False).returncode
    if code not in (0, 1) or not json_path.exists():
        print(f"ci_job run: pytest did not complete (exit status {code})", file=sys.stderr)
        return code or 2
    return code


def summary(
    run_path: Path,
    areas: Sequence[str],
    beside: Sequence[Path] = (),
    expectations_path: Path | None = None,
) -> str:
    """The job summary's Markdown for one run (see the module docstring)."""
    data: dict[str, Any] = json.loads(run_path.read_text())
    run = load_run(run_path)
    counts: dict[str, int] = {}
    for record in run.tests.values():
        counts[record.outcome] = counts.get(record.outcome, 0) + 1
    unexpected = {nodeid: r for nodeid, r in run.tests.items() if r.outcome in _UNEXPECTED}
    shown = ", ".join(f"{counts[o]} {o}" for o in ("passed", "xfail", "skipped", *_UNEXPECTED) if counts.get(o))
    verdict = "red" if unexpected else "green"
    lines = [f"## ckptspec: {run.label}", "", f"**{verdict}**: {shown or 'no tests'}.", ""]
    clause_areas = tuple(a for a in areas if a in clause_registry.AREAS) or tuple(clause_registry.AREAS)
    runs = [*(load_run(path) for path in beside), run]
    lines += ["### Verdicts", "", report.render(runs, clause_registry.load(clause_areas)).rstrip(), ""]
    if unexpected:
        lines += ["### Unexpected outcomes", "", "| test | outcome | clauses | message |", "| --- | --- | --- | --- |"]
        for nodeid, record in sorted(unexpected.items()):
            first = (record.message.strip().splitlines() or [""])[0][:_MESSAGE_CHARS]
            cited = ", ".join(sorted(record.cited))
            lines.append(f"| `{nodeid}` | {record.outcome} | {cited} | {_cell(first)} |")
        lines.append("")
    loaded = expectations.load(str(expectations_path)) if expectations_path and expectations_path.exists() else ()
    entries = expectations.for_version(loaded, data["version"], data.get("tensor_device", "cpu"))
    blocks, _ = record_failures.stubs(RunFile.read(run_path), entries)
    if blocks:
        lines += [
            f"<details><summary>{len(blocks)} stub entries for the expectations file (replace each FILL IN)</summary>",
            "",
            "```toml",
            "\n".join(blocks).rstrip(),
            "```",
            "</details>",
            "",
        ]
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")


def _summary(args: argparse.Namespace) -> int:
    try:
        beside = [*(stored_runs(args.stored, args.areas) if args.stored else ()), *args.beside]
    except FileNotFoundError as missing:
        print(f"ci_job summary: {missing}", file=sys.stderr)
        return 2
    text = summary(args.run, args.areas, beside, args.expectations)
    out = args.out or (Path(os.environ["GITHUB_STEP_SUMMARY"]) if os.environ.get("GITHUB_STEP_SUMMARY") else None)
    if out is None:
        print(text, end="")
    else:
        with out.open("a") as sink:
            sink.write(text)
        print(f"ci_job summary: appended to {out}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="python -m ckptspec.spec.harness.ci_job", description=__doc__.splitlines()[0])
    sub = top.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run the areas against the adapter, recording OUT/run.json")
    run.add_argument("--adapter", required=True, help="the adapter module or target name (pytest's --impl)")
    run.add_argument("--out", type=Path, required=True, help="where run.json goes")
    run.add_argument("--areas", nargs="+", default=list(DEFAULT_AREAS), metavar="AREA", choices=sorted(_AREA_PATHS))
    run.add_argument("-n", default="auto", help="pytest-xdist workers (default: auto)")
    run.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments")
    run.set_defaults(func=_run)
    summ = sub.add_parser("summary", help="the job summary of a run: verdicts, unexpected outcomes, stubs")
    summ.add_argument("run", type=Path, help="the run.json that `run` wrote")
    summ.add_argument("--areas", nargs="+", default=list(DEFAULT_AREAS), metavar="AREA", choices=sorted(_AREA_PATHS))
    summ.add_argument(
        "--stored", type=Path, help="conformance/all of a checkout: the reference and newest releases beside"
    )
    summ.add_argument("--beside", nargs="*", type=Path, default=[], help="stored runs shown as more columns")
    summ.add_argument("--expectations", type=Path, help="the expectations file the stubs are for")
    summ.add_argument("--out", type=Path, help="append here (default: $GITHUB_STEP_SUMMARY, else print)")
    summ.set_defaults(func=_summary)
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
