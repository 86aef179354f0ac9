"""Merge conformance JSON files of one target into one: a later run of a test replaces the earlier one.

    python -m ckptspec.report.merge_runs OUT.json FULL.json RERUN.json ...

For a full run completed by later runs of a few modules (a changed test, a new clause) without running the whole
suite again. Every input must be a run of the same target and version (else an error naming both); a test recorded
by a later file replaces every record of that nodeid in the earlier ones (all its phases), the clause registry is
the union (the later file's entry wins), the provenance is every input's parts in order (each part once), and the
output says which files it came from ("merged_from"). The report
and the fault matrix read the output like any run.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from ckptspec.report import provenance
from ckptspec.report.run_file import ReportError, RunFile

__all__ = ["main", "merge"]


def merge(paths: Sequence[Path | str]) -> RunFile:
    """The merged run of `paths`, oldest first (each validated by RunFile.read)."""
    if not paths:
        raise ReportError("nothing to merge: give at least one JSON file")
    merged: RunFile | None = None
    for path in paths:
        data = RunFile.read(path)
        if merged is None:
            merged, first = replace(data, tests=list(data.tests), clauses=dict(data.clauses)), path
            continue
        if data.label != merged.label:
            raise ReportError(f"{path}: a run of {data.label!r}, but {first} is a run of {merged.label!r}")
        rerun = {test.nodeid for test in data.tests}
        merged.tests = [t for t in merged.tests if t.nodeid not in rerun] + data.tests
        merged.clauses.update(data.clauses)
        earlier = list(merged.provenance or [])
        later = [part for part in data.provenance or [] if part not in earlier]
        merged.provenance = earlier + later if earlier or later else None
    assert merged is not None
    merged.merged_from = [str(p) for p in paths]
    if merged.provenance:
        merged.format = provenance.FORMAT
    return merged


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m ckptspec.report.merge_runs", description=__doc__.split("\n")[0])
    parser.add_argument("out", type=Path, help="the merged JSON file to write")
    parser.add_argument("files", nargs="+", type=Path, help="conformance JSON files of one target, oldest first")
    args = parser.parse_args(argv)
    if args.out.resolve() in {p.resolve() for p in args.files}:
        parser.error(f"{args.out} is also an input: write the merged run to a new file")
    try:
        merged = merge(args.files)
    except ReportError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    merged.write(args.out)
    print(f"{args.out}: {len(merged.tests)} records from {len(args.files)} runs of {merged.label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
