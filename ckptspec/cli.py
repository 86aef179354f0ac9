"""`ckptspec`: judge the checkpointing library installed in this environment, or read stored runs.

    ckptspec judge nvrx|mcore|dcp|torchtitan|lightning|deepspeed|olmo-core|transformers|torch-checkpointing|ADAPTER
                   [--areas AREA ...] [-n N] [--tensor-device DEV] [--out DIR]
    ckptspec report [JSON ...] [options of python -m ckptspec.report.report]
    ckptspec findings [JSON ...] --out DIR
    ckptspec pytest [PYTEST_ARGS ...]
    ckptspec --version

`judge` installs nothing and changes nothing in the environment: it reads the installed version of the target's
distribution (as the suite does), runs pytest on the suites (or the areas asked for) against it in a process of its
own, writes the run JSON and the findings page into DIR (default `ckptspec-judged/` under the working directory),
and prints a short report: what the release keeps, what it breaks by severity, what to do (findings/advice.toml).
A library that cannot be set up here (it, or what the adapter imports of it, fails to import) is not judged: the
run stops with one line naming the cause and the installed version, or those tests read "not judged (could not set
up)", never a break; the exit status is 2 when no test could set it up.
When the project has a recorded run of that version (ckptspec/report/releases.py), the target's expectations
file applies, so a known failure reads as the clause it breaks; for any other version the expectations are not
applied ($CKPTSPEC_NO_EXPECTATIONS), every failure is reported as it happened, charged to each clause its test
cites, and the report says that no recorded run exists. `dcp` judges the three configurations of `dcp.async_save`
in turn; `deepspeed-decoupled` and `torch-checkpointing-buffered` are the other configuration of those libraries.
`report` and `findings` read runs (by default the stored runs this copy carries) and need no torch:
`pip install ckptspec` alone installs them; `judge` and `pytest` need the `test` extra.

`pytest` runs pytest in the working directory with the suite's configuration and its rootdir, from a checkout or
an installed copy alike (ckptspec/report/installed.py), so that `ckptspec pytest --pyargs ckptspec.spec.protocol
--impl mylib.ckptspec_adapter` names each test as the expectations files do. `--version` prints ckptspec's version
(the installed distribution's metadata).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from ckptspec.report import advice, findings, glance, installed, provenance, releases, report, verdicts
from ckptspec.report import clauses as clause_registry
from ckptspec.report.runs import REPO_ROOT, Run, load_run, page_name

__all__ = ["main"]

ALIASES = {"dcp": ("dcp-thread", "dcp-process", "dcp-staged")}
# --areas: a clause area runs its directory of ckptspec/spec; `faults` the fault suite; `api` the API surface tests.
AREA_PATHS = {
    **{area: (f"ckptspec/spec/{area}",) for area in releases.ALL_AREAS},
    "faults": ("ckptspec/faults",),  # the clause area's tests are the fault suite
    "api": ("ckptspec/spec/test_api_surface.py", "ckptspec/spec/test_nvrx_helpers.py"),
}
_STRICTER = verdicts.BROKEN_WORDS["decision"]
# The findings page's first words for a stored run; a judged run's page names its JSON instead.
_STORED_HEADER = "Generated from the stored run `conformance/all/` by `python regenerate.py`: do not edit."


def _installed_version(target: str) -> str:
    """The installed version of `target`, read by the suite's own code in a process of its own (it imports torch)."""
    code = f"from ckptspec.spec.harness.surface.loading import load_target; print(load_target({target!r}).version)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise SystemExit(f"ckptspec judge: {target!r} cannot be judged here, nothing was judged: {last}")
    return done.stdout.strip().splitlines()[-1]


def _out_dir(path: Path | None) -> Path:
    out = (path or Path.cwd() / "ckptspec-judged").resolve()
    if "site-packages" in out.parts or "dist-packages" in out.parts:
        raise SystemExit(f"ckptspec judge: {out} is inside an installation; give --out a directory of your own")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _judge_one(target: str, args: argparse.Namespace, out: Path) -> int:
    version = _installed_version(target)
    release = releases.find(target, version)
    recorded = target == releases.REFERENCE or release is not None
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.setdefault("HYPOTHESIS_PROFILE", "ci")
    if not recorded:
        env[provenance.NO_EXPECTATIONS_VAR] = f"no recorded run of {target} {version} in this project"
    stem = f"{target}-{releases.base_version(version)}".replace("(source tree)", "source-tree")
    json_path, log = out / f"{stem}.json", out / f"{stem}.log"
    paths = [p for area in args.areas for p in AREA_PATHS[area]] if args.areas else list(releases.SUITES)
    command = [sys.executable, "-m", "pytest", *installed.pytest_options(), *paths, "-n", args.n, "-q"]
    command += ["-p", "no:randomly", "--impl", target]
    command += ["--conformance-json", str(json_path)]
    command += ["--tensor-device", args.tensor_device] if args.tensor_device else []
    print(f"ckptspec: judging {target} {version} on {' '.join(paths)} (pytest's output: {log})", flush=True)
    start = time.monotonic()
    with log.open("w") as sink:
        code = subprocess.run(command, cwd=REPO_ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT, check=False)
    wall = time.monotonic() - start
    if code.returncode not in (0, 1) or not json_path.exists():
        print(f"ckptspec judge: pytest did not complete (exit status {code.returncode}); see {log}", file=sys.stderr)
        return 2
    run = load_run(json_path)
    registry = clause_registry.load()
    rules = advice.load(registry)
    page = out / f"{page_name(run)}.md"
    text = findings.page(run, registry, rules=rules)
    page.write_text(text.replace(_STORED_HEADER, f"Written by `ckptspec judge` from {json_path.name}.", 1))
    print(summary(run, registry, rules, recorded=recorded, wall_s=wall))
    print(f"Written: {page} (the findings page), {json_path} (the run)\n")
    return 2 if set_up_failed(run) else 0


def set_up_failed(run: Run) -> bool:
    """Whether no test of `run` judged the library: some failed to set it up, and none passed or failed otherwise."""
    outcomes = [r for r in run.tests.values() if r.outcome != "skipped"]
    return any(r.setup_failure for r in outcomes) and all(r.setup_failure for r in outcomes)


def summary(
    run: Run,
    registry: Mapping[str, Mapping[str, Any]],
    rules: Sequence[advice.Rule],
    *,
    recorded: bool,
    wall_s: float,
) -> str:
    """The plain-language report of one judged run: each line says what it counts, and a test that could not set up
    the library (an import error: the environment's or the adapter's) is counted apart, never as a break."""
    judged = {cid: report.clause_verdict(run, cid, registry) for cid in registry}
    judged = {cid: v for cid, v in judged.items() if v.word != verdicts.NOT_COVERED}
    decision = {cid for cid in judged if verdicts.basis_of(registry[cid]) == "decision"}
    kept = [cid for cid, v in judged.items() if v.word == verdicts.PASSES and not v.missed]
    not_set_up = [cid for cid, v in judged.items() if v.word == verdicts.NOT_SET_UP]
    failed = [cid for cid, v in judged.items() if v.word == verdicts.UNEXPECTED]
    broken = [
        cid
        for cid, v in judged.items()
        if (v.broken and v.word != _STRICTER) or (v.intermittent and cid not in decision)
    ]
    stricter = [cid for cid, v in judged.items() if v.word == _STRICTER or (v.intermittent and cid in decision)]
    weak = [cid for cid, v in judged.items() if v.word == verdicts.WEAK_ONLY]
    blocked = [cid for cid, v in judged.items() if v.word == verdicts.NOT_JUDGED]
    counted = {*kept, *not_set_up, *failed, *broken, *stricter, *weak, *blocked}
    rest = [cid for cid in judged if cid not in counted]
    lines = [f"\n{run.label}: {len(judged)} clauses have tests in this run ({wall_s:.0f} s)."]
    causes = sorted({r.setup_failure for r in run.tests.values() if r.setup_failure})
    if not_set_up:
        lines.append(
            f"Could not set up the library for the tests of {len(not_set_up)} clauses ({'; '.join(causes)}): an "
            "environment or adapter failure, not a verdict; those clauses are not judged."
        )
    if recorded:
        lines.append("This release has a recorded run here: its known failures are read as the clauses they break.")
    else:
        lines.append(
            "No recorded run of this version exists in this project: it was judged without expectations, so a "
            "failing test is listed as it happened under each clause it cites, unconfirmed (a failure may come "
            "from this environment rather than the library; the findings page lists the tests)."
        )
    lines.append(f"Every test passed for {len(kept)} clauses.")
    if weak:
        lines.append(f"Met at the weak level only: {len(weak)} clauses ({', '.join(weak)}).")
    if blocked:
        lines.append(
            f"Not judged: {len(blocked)} clauses, whose tests fail first on another clause's break (the findings "
            "page names it)."
        )
    if rest:
        lines.append(
            f"Not applicable to it, not run here or skipped: {len(rest)} clauses (the findings page says which)."
        )
    if not broken and not failed:
        lines.append("No test showed a break of the library's documented or implied promises.")
    for title, ids in (("Breaks", broken), ("Failed tests, not in any expectations entry", failed)):
        by_severity: dict[str, list[str]] = {}
        for cid in sorted(ids, key=lambda c: findings.severity_rank(_severity(run, c, registry))):
            by_severity.setdefault(_severity(run, cid, registry) or "severity not assessed", []).append(cid)
        for severity, group in by_severity.items():
            lines.append(f"{title}, {severity} ({len(group)} clauses):")
            lines += [f"  - {cid}: {glance.symptom(registry[cid])} [{judged[cid]}]" for cid in group]
    if stricter:
        lines.append(
            f"Misses {len(stricter)} decisions of this spec (stricter than documented): {', '.join(stricter)}."
        )
    applying = advice.for_run(rules, run, registry)
    if applying:
        lines.append("What to do:")
        lines += [f"  - {rule.rule} ({', '.join(cids)})" for rule, cids in applying]
    return "\n".join(lines)


def _severity(run: Run, cid: str, registry: Mapping[str, Mapping[str, Any]]) -> str:
    return str(run.severity(cid, registry[cid].get("severity", "")))


def _suite_missing(command: str) -> str | None:
    """Why `command` cannot run the suite here (`pip install ckptspec` without the `test` extra), or None."""
    import importlib.util

    absent = [name for name in ("torch", "pytest", "hypothesis") if importlib.util.find_spec(name) is None]
    if not absent:
        return None
    return (
        f"ckptspec {command}: the suite needs {', '.join(absent)}, not installed here; install "
        "`ckptspec[test]` beside your torch (`ckptspec report` and `ckptspec findings` need neither)"
    )


def _judge(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="ckptspec judge", description="judge the installed library, change nothing")
    parser.add_argument(
        "target",
        help="nvrx, mcore, dcp, torchtitan, lightning, deepspeed, olmo-core, transformers, torch-checkpointing, or an "
        "adapter (module or name)",
    )
    parser.add_argument("--areas", nargs="+", choices=sorted(AREA_PATHS), metavar="AREA", help="default: everything")
    parser.add_argument("-n", default="auto", help="pytest-xdist workers (default: auto)")
    parser.add_argument("--tensor-device", choices=("cpu", "cuda"), help="where the snapshot tests keep the state")
    parser.add_argument("--out", type=Path, help="where the run and its page go (default: ./ckptspec-judged)")
    args = parser.parse_args(argv)
    if (missing := _suite_missing("judge")) is not None:
        raise SystemExit(missing)
    out = _out_dir(args.out)
    codes = [_judge_one(target, args, out) for target in ALIASES.get(args.target, (args.target,))]
    return max(codes)


def _pytest(argv: Sequence[str]) -> int:
    if (missing := _suite_missing("pytest")) is not None:
        raise SystemExit(missing)
    import pytest  # in this process, as the `pytest` command runs it

    return int(pytest.main([*installed.pytest_options(anywhere=True), *argv]))


def version() -> str:
    """ckptspec's version, from the installed distribution's metadata (a checkout installed editable has it too)."""
    try:
        return metadata.version("ckptspec")
    except metadata.PackageNotFoundError:
        return "unknown (ckptspec is not installed: pip install -e .)"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--version"]:
        print(f"ckptspec {version()}")
        return 0
    commands = {"judge": _judge, "report": report.main, "findings": findings.main, "pytest": _pytest}
    if argv[:1] in (["--help"], ["-h"]):
        print(__doc__.split("\n\n")[1])
        return 0
    if not argv or argv[0] not in commands:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    return int(commands[argv[0]](argv[1:]) or 0)


if __name__ == "__main__":
    sys.exit(main())
