"""The results of a stored GPU run as one Markdown table: each test of the GPU selection against each target.

`render(folder)` reads the conformance JSON files a run left (`<stage>.json`, as `gpu_run run` writes them, with
`summary.json` beside them) and returns the table, its notes and the machine. A cell says what the run showed:

- "passes"; "fails as listed" (an expected failure of the target's expectations file, the clause it charges in the
  notes); "FAILS (not listed)";
- "not judged: harness ..." for a failure whose cause is the harness, not the target (HARNESS_CAUSES: the failure's
  text and what it means), so that such a cell is never read as the target's verdict;
- "skipped (...)" with the reason, and "not reached" for a test that the stage's budget cut before it ran.

Standard library only, like the rest of gpu_run; `update(path, text)` replaces the block between
`<!-- gpu-results:start -->` and `<!-- gpu-results:end -->` of a Markdown file.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from ckptspec.report.run_file import PhaseRecord, RunFile
from gpu_run.plan import DCP_TARGETS, RELEASES

START, END = "<!-- gpu-results:start -->", "<!-- gpu-results:end -->"
# (a regular expression searched in a failure's text, what it means): failures of the harness, not of the target.
HARNESS_CAUSES = (
    (
        r"did not become free within",
        "the test waited for the GPU that other tests held (eight runs shared one GPU) and never started",
    ),
    (
        r"in _own\n.*\n.*\n.*torch/cuda/__init__\.py.*\n(.*\n)*?.*Cannot re-initialize CUDA in forked subprocess",
        "the rank, forked from a server that had imported the target, could not build the test's CUDA state",
    ),
    (
        r"A CPU backend must be enabled for async save",
        "the harness made the trainer's group NCCL only, which torch's async_save refuses; DCP targets now get "
        "'cpu:gloo,cuda:nccl' (NCCL_BACKEND)",
    ),
)
_ORDER = ("impl", *RELEASES, *DCP_TARGETS)  # the columns' order: the release list's


def _column(stage: str) -> str:
    return re.sub(r"-(lease|gpu)$", "", stage)


def _cell(test: PhaseRecord) -> tuple[str, str | None]:
    """The cell's words and, for a failure, the note that explains it."""
    # The recorded failure text is cut at its end for long rank tracebacks; the message keeps the end.
    outcome = test.outcome
    text = (test.failure.text if test.failure else "") + "\n" + test.message
    if outcome == "passed":
        return "passes", None
    if outcome == "xpass":
        return "passes (listed as an intermittent failure)", None
    if outcome == "skipped":
        return f"skipped ({test.message.split(': ', 1)[-1][:60]})", None
    if outcome in ("failed", "error"):
        for pattern, meaning in HARNESS_CAUSES:
            if re.search(pattern, text):
                return "not judged: harness", meaning
    if left := re.findall(r"^\s*(shared memory \S+|process .+|temporary file \S+)(?: \(.*\))?$", text, re.MULTILINE):
        shown = ", ".join(dict.fromkeys(left[:2]))
        more = f" and {len(left) - 2} more" if len(left) > 2 else ""
        return "FAILS (not listed)", f"the orphan audit (FI-ORPHAN-1) found {len(left)} leftovers: {shown}{more}"
    first = _root_error(text)
    if outcome == "xfail":
        clauses = ", ".join(test.entry.clauses if test.entry else ()) or "?"
        if (
            first.startswith(
                (
                    "RankFailures",
                    "ckptspec.spec.harness.ranks.RankFailures",
                    "ckptspec.spec.harness.ranks.vocabulary.RankFailures",
                )
            )
            or not first
        ):
            first = "as listed: " + test.message.split("] ", 1)[-1]  # the entry's reason
        return "fails as listed", f"charged to {clauses}: {first[:160]}"
    return "FAILS (not listed)", first[:200]


def _root_error(text: str) -> str:
    """The innermost error line of a failure's text (a rank's exception, not the RankFailures that carries it)."""
    errors = [m.group(1) for m in re.finditer(r"((?:\w+\.)*\w+(?:Error|Exception|Timeout)\b:? .*)", text)]
    errors = [e for e in errors if not e.split(":")[0].endswith(("RankFailures", "XFailed"))]
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return (errors[-1] if errors else lines[0] if lines else "").strip()


def render(folder: Path) -> str:
    """The Markdown of a stored GPU run in `folder`."""
    summary = json.loads((folder / "summary.json").read_text())
    runs = {}
    for path in sorted(folder.glob("*.json")):
        if path.name != "summary.json" and "tests" in json.loads(path.read_text()):
            runs[_column(path.stem)] = RunFile.read(path)
    columns = [c for c in _ORDER if c in runs] + sorted(set(runs) - set(_ORDER))
    cells: dict[str, dict[str, str]] = {}
    clauses: dict[str, str] = {}
    notes: list[str] = []
    for column in columns:
        for test in runs[column].tests:
            row = test.nodeid
            clauses[row] = ", ".join(test.clauses)
            words, note = _cell(test)
            if note:
                notes.append(f"{column}, `{row.split('::', 1)[1]}`: {note}")
                words += f" [{len(notes)}]"
            cells.setdefault(row, {})[column] = words
    machine = summary.get("machine", {})
    lines = [
        f"Run {folder.name}: {machine.get('gpu')}, torch {machine.get('torch')} (CUDA {machine.get('cuda')}), "
        f"Python {machine.get('python')}; tensor device of the snapshot family: "
        + ", ".join(sorted({str(run.tensor_device) for run in runs.values()}))
        + ". Each target's stage ran at the same time as the others (two pytest workers each); "
        'a test that its stage\'s budget cut before it ran reads "not reached".',
        "",
        "| test | clauses | " + " | ".join(columns) + " |",
        "| --- | --- | " + " | ".join("---" for _ in columns) + " |",
    ]
    for row in sorted(cells):
        name = row.split("::", 1)[1]
        lines.append(
            f"| `{name}` | {clauses[row]} | " + " | ".join(cells[row].get(c, "not reached") for c in columns) + " |"
        )
    lines += ["", *(f"{i}. {note}" for i, note in enumerate(notes, 1))]
    return "\n".join(lines) + "\n"


def update(path: Path, text: str) -> None:
    """Replace the gpu-results block of the Markdown file at `path` with `text`."""
    document = path.read_text()
    if document.count(START) != 1 or document.count(END) != 1 or document.index(START) > document.index(END):
        raise ValueError(f"{path}: needs one {START} line before one {END} line")
    head, rest = document.split(START, 1)
    tail = rest.split(END, 1)[1]
    path.write_text(f"{head}{START}\n{text}{END}{tail}")


def main(argv: list[str] | None = None) -> int:
    """`python -m gpu_run.results FOLDER... [--update FILE]`: print the tables, or write them into FILE's block."""
    parser = argparse.ArgumentParser(prog="python -m gpu_run.results", description=__doc__.splitlines()[0])
    parser.add_argument(
        "folders", nargs="+", type=Path, help="stored runs, newest first: each its <stage>.json files and summary.json"
    )
    parser.add_argument("--update", type=Path, help="replace the gpu-results block of this Markdown file")
    args = parser.parse_args(argv)
    text = "\n".join(render(folder) for folder in args.folders)
    if args.update is None:
        print(text, end="")
    else:
        update(args.update, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
