"""The GPU run in one command (docs/gpu.md).

    python -m gpu_run prepare                  here, with network: fill gpu_run/wheelhouse (Python 3.12 wheels)
    python -m gpu_run plan                     the stages, budgets and device calls, with each call's command
    python -m gpu_run run --all                on a GPU node: every stage, in order
    python -m gpu_run run --call N --pack      on a lent device machine: call N (of plan's list), within 600 s
    python -m gpu_run run --stage NAME ...     chosen stages
    python -m gpu_run results DIR --update F   a stored run (conformance/gpu/<run>) as the table of F's gpu-results block
                                               (the same as python -m gpu_run.results DIR --update F)
    ... run --dry-run                          set-up and the checks only, as without a GPU: stages end at the skips

Results go to --out (default $OUT, else ./gpu-results): <stage>.log, <stage>.json, summary.json, summary.md;
--pack moves all but the summaries into one archive. Exit status: 0, or 1 when a set-up or a stage had a problem
(failing tests are verdicts, recorded in the JSON, not problems of the run); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from gpu_run import plan, results, runner, wheels

WHEELHOUSE = plan.ROOT / "gpu_run" / "wheelhouse"
CARRY_LIMIT_MIB = 64.0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m gpu_run", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="download the wheels the GPU machine will install from (needs network)")
    prep.add_argument("--wheelhouse", type=Path, default=WHEELHOUSE)
    prep.add_argument("--python-version", default="3.12", help="Python of the GPU machine (default 3.12)")
    prep.add_argument("--group", action="append", help="only this group (repeatable; default: all)")
    show = sub.add_parser("plan", help="print the stages, budgets and device calls")
    show.add_argument("--wheelhouse", type=Path, default=WHEELHOUSE)
    table = sub.add_parser("results", help="stored runs' results as Markdown tables")
    table.add_argument("folders", nargs="+", type=Path, help="folders of runs' <stage>.json files and summary.json")
    table.add_argument("--update", type=Path, help="replace the gpu-results block of this Markdown file")
    run = sub.add_parser("run", help="set up and run stages (offline)")
    which = run.add_mutually_exclusive_group(required=True)
    which.add_argument("--all", action="store_true", help="every stage, in order, no call deadline")
    which.add_argument(
        "--call",
        type=int,
        help=f"device call 1..{len(plan.CALLS)} (its stages, within 570 s; {plan.LEASE_CALL}: a 15-minute lease; "
        f"{plan.SWEEP_CALL}: the GPU sweeps, within a 15-minute lease)",
    )
    which.add_argument("--stage", action="append", choices=list(plan.BY_NAME), help="a stage (repeatable)")
    run.add_argument("--dry-run", action="store_true", help="set-up and checks only, as on a machine without a GPU")
    run.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "gpu-results"))
    run.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ckptspec-gpu")
    run.add_argument("--wheelhouse", type=Path, default=WHEELHOUSE)
    run.add_argument("--python", default=sys.executable, help="the Python with torch (default: this one)")
    run.add_argument(
        "--deadline-s",
        type=float,
        help=f"the call's time (default with --call: 570, calls {plan.LEASE_CALL} and {plan.SWEEP_CALL} "
        f"{plan.LEASE_DEADLINE_S}; else none)",
    )
    run.add_argument("--pack", action="store_true", help="pack logs and JSON into one archive (device calls)")
    return parser


def _carry(groups: list[str]) -> list[str]:
    return [f"gpu_run/wheelhouse/{group}" for group in groups]


CALL_CARRY_MIB = 64  # what one device call carries: the checkout's files and the carried folders together
ASIDE = "conformance/gpu"  # stored GPU runs: read by no stage, the first thing to move aside for a call


def _tracked_mib(under: str = ".") -> float | None:
    """The size of the files git tracks under `under` (what a device call copies), or None without git."""
    try:
        names = subprocess.run(
            ["git", "ls-files", "-z", "--", under], capture_output=True, check=True, cwd=plan.ROOT
        ).stdout.split(b"\0")
    except (OSError, subprocess.CalledProcessError):
        return None
    paths = (plan.ROOT / os.fsdecode(name) for name in names if name)
    return sum(path.stat().st_size for path in paths if path.is_file()) / (1 << 20)


def _print_plan(wheelhouse: Path) -> None:
    print("stages (most important first):")
    for stage in plan.STAGES:
        what = (
            f"python {' '.join(stage.command)}"
            if stage.command
            else f"--impl {stage.target:<12} {' '.join(stage.args)}"
        )
        print(f"  {stage.name:<20} {stage.budget_s:>4} s  {what}")
    checkout, aside = _tracked_mib(), _tracked_mib(ASIDE) or 0.0
    print(f"\ndevice calls (each within {plan.CALL_LIMIT_S} s, {plan.SETUP_S} s of it for the set-up):")
    for number in range(1, len(plan.CALLS) + 1):
        stages = plan.call_stages(number)
        groups = plan.call_groups(stages)
        sizes = [wheels.folder_mib(wheelhouse / g) for g in groups if (wheelhouse / g).is_dir()]
        total = plan.call_seconds(stages)
        print(f"  call {number}: {', '.join(s.name for s in stages)}  ({total} s; carry {sum(sizes):.1f} MiB)")
        print(f"    run tool: command='python3 -m gpu_run run --call {number} --pack', carry={_carry(groups)}")
        if checkout is not None and checkout + sum(sizes) > CALL_CARRY_MIB:
            over = checkout + sum(sizes) - CALL_CARRY_MIB
            print(
                f"    over the {CALL_CARRY_MIB} MiB a call carries by {over:.1f} MiB with the checkout's "
                f"{checkout:.1f} MiB: move {ASIDE}/ ({aside:.1f} MiB, read by no stage) out of the tree for the call"
            )


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "prepare":
        for group, what in wheels.prepare(args.wheelhouse, args.python_version, args.group).items():
            print(f"{group}: {what}")
        _print_plan(args.wheelhouse)
        return 0
    if args.command == "results":
        return results.main([*map(str, args.folders), *(["--update", str(args.update)] if args.update else [])])
    if args.command == "plan":
        _print_plan(args.wheelhouse)
        return 0
    if args.call is not None:
        try:
            stages = plan.call_stages(args.call)
        except ValueError as exc:
            print(f"gpu_run: {exc}", file=sys.stderr)
            return 2
        default = plan.LEASE_DEADLINE_S if args.call in plan.LEASE_SIZED else plan.CALL_LIMIT_S
        deadline = args.deadline_s or default
    else:
        stages = list(plan.STAGES) if args.all else [plan.BY_NAME[name] for name in args.stage]
        deadline = args.deadline_s
    problems = runner.run_stages(
        stages,
        python=args.python,
        wheelhouse=args.wheelhouse.resolve(),
        work=args.work.resolve(),
        out=args.out.resolve(),
        dry_run=args.dry_run,
        deadline_s=deadline,
        log=lambda line: print(line, flush=True),
    )
    print((args.out / "summary.md").read_text())
    if args.pack:
        name = f"call{args.call}" if args.call is not None else "stages"
        print(f"packed: {runner.pack(args.out, f'ckptspec-gpu-{name}')}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
