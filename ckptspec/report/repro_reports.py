"""Maintainer reports: for each documented or implied data-loss or hang break, a page ready to file upstream.

    python -m ckptspec.report.repro_reports conformance/all/*.json --out findings/repro

writes `<out>/<target>-<release>/<CLAUSE>.md` beside the reproducer `findings/repro/<target>-<release>/<CLAUSE>.py`
for every break ckptspec.report.findings.reportable selects, and removes the other `.md` files of those release
directories (a break that is gone loses its report). A report gives:

- a title: what goes wrong, naming the API (findings/report-titles.toml, by target or target-release; a reported
  break without a title is an error);
- the affected releases (every given run of the same target that breaks the clause, with its verdict) and the
  known-good ones (impl where its run passes the clause, and every release of the target whose run passes it);
- the promise: the clause's statement, its basis (documented: the library's own documents; implied: its own code or
  docstrings) and its quoted source;
- the reproducer command as a user types it from a clone, and its captured output on the release and on impl
  (`<CLAUSE>.out`, `<CLAUSE>.impl.out`, recorded by ckptspec.report.repro_capture; a missing capture is said);
- the mechanism in the release's code: the reasons of the release's expectations entries for the clause
  (the findings pages' "Mechanism"), and the tests that show it.

Reports are generated (python regenerate.py, which also checks them for drift): edit the clauses, the
expectations, the runs, the titles or the captures, never a report. The text depends only on those inputs.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ckptspec.report import clauses as clause_registry
from ckptspec.report import verdicts
from ckptspec.report.findings import (
    REPRO_DIR,
    mechanisms,
    report_path,
    reportable,
    repro_path,
    tests_showing,
)
from ckptspec.report.report import clause_verdict
from ckptspec.report.repro_capture import IMPL, PACKAGES, Captured, out_path, package_arguments, read
from ckptspec.report.runs import REPO_ROOT, ReportError, Run, load_run, page_name

__all__ = ["TITLES", "main", "report", "reports"]

TITLES = "findings/report-titles.toml"
_BASES = {
    "documented": "documented: promised by the library's own documents",
    "implied": "implied: followed from the library's own code or docstrings",
}


def _target(run: Run) -> str:
    return run.label.split(" ", 1)[0]  # "nvrx" of "nvrx 0.7.0", "impl" of "impl (source tree)"


def _release_order(run: Run) -> list[tuple[int, str]]:
    """Runs by label, release numbers compared as numbers (0.16.1 before 0.19.2), whatever order they came in."""
    return [(int(part), "") if part.isdigit() else (-1, part) for part in re.split(r"(\d+)", run.label)]


def _title(titles: Mapping[str, Mapping[str, str]], run: Run, cid: str) -> str:
    for key in (page_name(run), _target(run)):
        if cid in titles.get(key, {}):
            return titles[key][cid]
    raise ReportError(f"{TITLES}: no title for {cid} on {page_name(run)} (add it under [{_target(run)}])")


def _fence(lines: Sequence[str]) -> list[str]:
    return ["```", *(lines or ["(nothing)"]), "```"]


def _output(captured: Captured | None, where: str, capture_command: str) -> list[str]:
    if captured is None:
        return [f"On {where}: not captured yet (`{capture_command}`).", ""]
    code = captured.exit_code
    meanings = {0: "the clause holds", 1: "the clause breaks", 2: "the reproducer could not run"}
    meaning = meanings.get(code, "") if code is not None else ""
    head = f"On {where}: `{captured.command}`, exit status {captured.status}"
    lines = [f"{head}{f' ({meaning})' if meaning else ''}, {captured.duration}. Standard output, last lines:", ""]
    lines += [*_fence(captured.stdout), ""]
    if captured.stderr:
        lines += ["Standard error, last lines:", "", *_fence(captured.stderr), ""]
    return lines


def _captured(root: Path, path: Path) -> Captured | None:
    return read(root / path) if (root / path).exists() else None


def _releases(run: Run, cid: str, runs: Sequence[Run], registry: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """The affected and known-good lines: the same target's runs, then impl."""
    affected, good = [], []
    for other in sorted(runs, key=_release_order):
        if _target(other) == _target(run):
            verdict = clause_verdict(other, cid, {**other.clauses, **registry})
            this = " (this report)" if other is run else ""
            if verdict.broken or verdict.intermittent:
                affected.append(f"- {other.label}{this}: {verdict}")
            elif verdict.word == verdicts.WEAK_ONLY:  # the strict promise this report is about breaks there
                strict = verdicts.judge(other.citing(cid), cid, {**other.clauses, **registry})
                affected.append(f"- {other.label}{this}: {strict} (its weak level holds)")
            elif verdict.word == verdicts.PASSES:
                good.append(f"- {other.label}: {verdict}")
        elif _target(other) == IMPL and clause_verdict(other, cid, registry).word == verdicts.PASSES:
            good.append(f"- {other.label}, ckptspec's reference implementation: passes")
    if not any(not line.startswith(f"- {IMPL} ") for line in good):
        good.append(f"- no stored release of {_target(run)} passes {cid}")
    head = "Affected (every stored run of this library that breaks the clause):"
    return [head, "", *affected, "", "Known good:", "", *good, ""]


def report(
    run: Run,
    cid: str,
    runs: Sequence[Run],
    registry: Mapping[str, Mapping[str, Any]],
    titles: Mapping[str, Mapping[str, str]],
    root: Path = REPO_ROOT,
) -> str:
    """The Markdown report of `run`'s break of clause `cid` (ends with a newline)."""
    clause = {**run.clauses, **registry}[cid]
    release = page_name(run)
    verdict = clause_verdict(run, cid, {**run.clauses, **registry})
    package = PACKAGES.get(_target(run), _target(run))
    script = repro_path(run, cid)
    capture_command = f"python -m ckptspec.report.repro_capture --release {release} --python PYTHON --clauses {cid}"
    lines = [
        f"# {run.label}: {_title(titles, run, cid)}",
        "",
        f"ckptspec clause {cid}, severity {clause.get('severity')}: {verdict}. Generated by `python regenerate.py` "
        "from the stored runs (`conformance/all/`, measured on CPU with gloo ranks) and the captured outputs of the "
        "reproducer: do not edit.",
        "",
        "## Affected releases",
        "",
        *_releases(run, cid, runs, registry),
        "## The promise",
        "",
        f"> {clause.get('statement', '')}",
        "",
        f"Basis: {_BASES.get(verdicts.basis_of(clause), verdicts.basis_of(clause))}. Source: {clause_registry.markdown_source(str(clause.get('source', '')))}",
        "",
        "## Reproducer",
        "",
        f'From a clone of ckptspec, in an environment with torch and {run.label} (`nox -s "spec({release})" '
        "--install-only` makes one); it needs only torch and the library, runs on CPU, and exits 1 where the clause "
        "breaks, 0 where it holds, 2 when it could not run:",
        "",
        *_fence([f"python {script} {package}"]),
        "",
        f"([`{script.name}`]({script.name}); its docstring gives the clause, the source and the mechanism.)",
        "",
        *_output(_captured(root, out_path(release, cid, package)), run.label, capture_command),
    ]
    if IMPL in package_arguments(root / script):
        lines += _output(_captured(root, out_path(release, cid, IMPL)), "impl", capture_command)
    else:
        lines += [f"The reproducer takes only {package}; impl is judged on {cid} by the suite (above).", ""]
    lines += [f"## Mechanism in {run.label}'s code", ""]
    lines += [f"- {m}" for m in mechanisms(run, cid)] or ["- not recorded"]
    lines += ["", "Shown in the suite by:", ""]
    lines += [f"- `{t}`" for t in tests_showing(run, cid)]
    lines += ["", f"All findings of {run.label}: [docs/findings/{release}.md](../../../docs/findings/{release}.md)."]
    return "\n".join(lines) + "\n"


def reports(
    runs: Sequence[Run],
    registry: Mapping[str, Mapping[str, Any]],
    titles: Mapping[str, Mapping[str, str]],
    root: Path = REPO_ROOT,
) -> dict[Path, str]:
    """Every report of the given runs: its path (relative to the repository root) -> its text."""
    made: dict[Path, str] = {}
    for run in runs:
        known = {**run.clauses, **registry}
        for cid in registry:
            if reportable(run, cid, known[cid], clause_verdict(run, cid, known), root):
                made[report_path(run, cid)] = report(run, cid, runs, registry, titles, root)
    return made


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {__spec__.name}", description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", type=Path, metavar="JSON", help="stored runs (conformance/all/*.json)")
    parser.add_argument("--out", type=Path, required=True, metavar="DIR", help=f"where {REPRO_DIR}/ goes")
    args = parser.parse_args(argv)
    try:
        runs = [load_run(path) for path in args.files]
        titles = tomllib.loads((REPO_ROOT / TITLES).read_text())
        made = reports(runs, clause_registry.load(), titles)
    except ReportError as exc:
        print(f"{parser.prog}: error: {exc}", file=sys.stderr)
        return 1
    for run in runs:
        for stale in (args.out / page_name(run)).glob("*.md"):
            if Path(REPRO_DIR, page_name(run), stale.name) not in made:
                stale.unlink()
    for path, text in made.items():
        target = args.out / path.relative_to(REPRO_DIR)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
