"""Command line of the regression pass (ckptspec/bench/README.md, "Regression pass"); run from the repository root.

    python -m ckptspec.bench.regression record --out BASELINE [--impl ADAPTER] [--runs 5] [--size-mib 8] [--rounds 7]
                                         [--threads 1] [-- PYTEST_ARGS]
    python -m ckptspec.bench.regression compare BASELINE [--threshold 3] [--history runs.jsonl] [--commit SHA] [--run RUN.json]
                                                     [--action-json FILE] [--summary FILE] [--keep-run FILE]
    python -m ckptspec.bench.regression compare --against REF [--impl ADAPTER] [--baseline-impl ADAPTER] [--repo DIR]
                                                     [--pairs 20] [--size-mib 32] [--tensors 64] [--threshold 1.1]
                                                     [--baseline-env N=V] [--current-env N=V] [--no-count]
                                                     [--device cpu|cuda]
                                                     [--json-out FILE] [--summary FILE]
    python -m ckptspec.bench.regression trend HISTORY --out trend.png
    python -m ckptspec.bench.regression scale BASELINE FACTOR --out PATH

`--impl ADAPTER` measures that target's or adapter's protocol saver (the peer `protocol:ADAPTER`,
ckptspec/bench/adapter_peer.py) instead of impl's `dcp:impl`; the baseline keeps it, so `compare` measures the same.
`--action-json` writes github-action-benchmark's customSmallerIsBetter JSON of the gated figures, `--summary`
appends the Markdown verdict to FILE (in Actions: "$GITHUB_STEP_SUMMARY"), `--keep-run` keeps the run's
pytest-benchmark JSON (ckptspec/bench/regression/export.py).

`compare --against REF` is the paired gate (ckptspec/bench/regression/paired_gate.py): the baseline's saver (REF: a
commit of --repo, default this checkout, or the path of a Python interpreter whose environment holds the baseline
release) and the current one measured in the same job, interleaved, each ratio with its 90% interval, and the
counted costs (system calls, files, bytes) compared exactly; no baseline file.

Exit status: 0 passed; 1 a gated figure regressed or is missing, or the regression set itself failed;
2 the baseline, history or threshold cannot be used (one line on stderr saying why).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

from ckptspec.bench import sides
from ckptspec.bench.regression import baseline as baselines
from ckptspec.bench.regression import compare as comparing
from ckptspec.bench.regression import export, history, paired_gate
from ckptspec.bench.regression.measure import ROOT, Settings, figures_of, run_set, source_of

PROG = "ckptspec.bench.regression"
UNUSABLE, FAILED = 2, 1


def _fail(message: str, status: int = UNUSABLE) -> int:
    print(f"{PROG}: {message}", file=sys.stderr)
    return status


def record(args) -> int:
    impl = ["--impl", args.impl] if args.impl else []
    settings = Settings(args.size_mib, args.rounds, args.threads, [*impl, *args.pytest_args])
    runs = []
    with tempfile.TemporaryDirectory(prefix="ckptspec-record-") as tmp:
        for i in range(1, args.runs + 1):
            print(f"{PROG}: record, run {i} of {args.runs}", flush=True)
            json_path = Path(tmp, f"run-{i}.json")
            status = run_set(settings, json_path)
            if status != 0:
                return _fail(
                    f"run {i} of the regression set failed (pytest exit status {status}); no baseline written", FAILED
                )
            runs.append(json.loads(json_path.read_text()))
    made = baselines.best_of(runs, settings)
    made.write(args.out)
    print(f"\nRun-to-run spread of each figure as compared ({args.runs} runs):")
    worst = 1.0
    for name, (spread, unit) in baselines.spread(runs).items():
        worst = max(worst, spread) if made.figures[name].gated else worst
        print(f"  {name}: {spread:.2f}x ({unit})")
    print(f"Worst spread of a gated figure {worst:.2f}x: a threshold under {worst * 1.5:.1f} would be flaky here.")
    src = made.data["source"]
    print(
        f"{PROG}: baseline written to {args.out}: best of {args.runs} runs, {src['machine']}, {src['python']}, torch {src['torch']}, commit {src['commit']}"
    )
    return 0


def compare(args) -> int:
    if args.against is not None:
        if args.baseline is not None:
            return _fail("give either a BASELINE file or --against REF, not both")
        return compare_paired(args)
    if args.baseline is None:
        return _fail("compare needs a BASELINE file (from `record`) or --against REF (a commit or an interpreter)")
    try:
        threshold = comparing.threshold_from(args.threshold)
        base = baselines.load(args.baseline)
    except (ValueError, baselines.BaselineError) as exc:
        return _fail(f"{exc}; record one first: python -m {PROG} record --out {args.baseline}")
    if args.run is not None:
        try:
            run = json.loads(args.run.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            return _fail(f"run {args.run}: cannot read it ({exc})")
        return _verdict(args, base, run, threshold)
    with tempfile.TemporaryDirectory(prefix="ckptspec-compare-") as tmp:
        json_path = Path(tmp, "run.json")
        status = run_set(base.settings, json_path)
        if status != 0:
            return _fail(f"the regression set itself failed (pytest exit status {status})", FAILED)
        if args.keep_run is not None:
            shutil.copyfile(json_path, args.keep_run)
        return _verdict(args, base, json.loads(json_path.read_text()), threshold)


def compare_paired(args) -> int:
    try:
        threshold = float(args.threshold) if args.threshold is not None else paired_gate.DEFAULT_THRESHOLD
    except ValueError:
        return _fail(f"threshold {args.threshold!r} is not a number (a factor such as 1.1)")
    if not threshold > 1 or args.pairs < 2 or args.tensors < 1 or not args.size_mib > 0:
        return _fail("--threshold must be above 1, --pairs at least 2, --tensors at least 1, --size-mib above 0")
    if refused := sides.device_problem(args.device):
        return _fail(refused)
    impl = args.impl or "impl"
    try:
        envs = [_assignments(args.baseline_env), _assignments(args.current_env)]
    except ValueError as exc:
        return _fail(str(exc))
    with sides.scratch_dir() as tmp:
        try:
            base = sides.side_spec("A", args.against, args.baseline_impl or impl, args.repo, tmp, envs[0])
            current = sides.side_spec("B", None, impl, args.repo, tmp, envs[1])
            result = paired_gate.measure(
                base, current, args.pairs, args.size_mib, args.tensors, tmp / "timed", args.device
            )
            if args.no_count:
                result.counted_note = "counted costs not measured (--no-count)"
            else:
                try:
                    result.counted = {
                        key: sides.count_saves(spec, args.size_mib, args.tensors, tmp / f"count-{key}", args.device)
                        for key, spec in (("A", base), ("B", current))
                    }
                except sides.GateError as exc:
                    if "strace" not in str(exc):
                        raise
                    result.counted_note = str(exc)
        except sides.GateError as exc:
            return _fail(str(exc), FAILED)
    result.threshold = threshold
    result.passed = paired_gate.verdict(result, threshold)[0]
    text = paired_gate.render(result, threshold)
    print(text, end="")
    if args.json_out is not None:
        args.json_out.write_text(json.dumps(result.as_dict(), indent=1) + "\n")
    if args.summary is not None:
        with args.summary.open("a") as sink:
            sink.write("\n" + text)
    passed, line = paired_gate.verdict(result, threshold)
    print(f"{PROG}: {line}")
    return 0 if passed else FAILED


def _assignments(pairs: list[str]) -> dict[str, str]:
    bad = [p for p in pairs if "=" not in p or not p.split("=", 1)[0]]
    if bad:
        raise ValueError(f"--baseline-env/--current-env take NAME=VALUE, not {bad[0]!r}")
    return dict(p.split("=", 1) for p in pairs)


def _verdict(args, base: baselines.Baseline, run: dict, threshold: float) -> int:
    rows = comparing.compare(base, figures_of(run), threshold)
    src = base.data["source"]
    print(
        f"\nBaseline {args.baseline}: best of {base.data['runs']} runs, {src['machine']}, {src['python']}, commit {src['commit']}"
    )
    print(comparing.render(rows, threshold), end="")
    for note in comparing.elsewhere(src, source_of(run)):
        print(f"note: {note}")
    if args.history is not None:
        entry = history.entry(
            rows, source=source_of(run), commit=args.commit, baseline=str(args.baseline), threshold=threshold
        )
        history.append(args.history, entry)
        print(f"{PROG}: appended to the history {args.history}")
    line = comparing.verdict_line(rows, threshold, str(args.baseline))
    print(f"{PROG}: {line}")
    if args.action_json is not None:
        args.action_json.write_text(json.dumps(export.action_benchmark(rows), indent=1) + "\n")
    if args.summary is not None:
        with args.summary.open("a") as sink:
            sink.write(export.summary(rows, threshold, line, baseline_peer(base)))
    return FAILED if line.startswith("FAIL") else 0


def baseline_peer(base: baselines.Baseline) -> str:
    """The peer a baseline measures: `protocol:ADAPTER` where it was recorded with --impl, else dcp:impl."""
    from ckptspec.bench.adapter_peer import regression_peer  # imports torch: only where a summary is written

    args = list(base.settings.pytest_args)
    impl = args[args.index("--impl") + 1] if "--impl" in args[:-1] else "impl"
    return regression_peer(impl)


def trend(args) -> int:
    try:
        entries = history.read(args.history)
    except history.HistoryError as exc:
        return _fail(str(exc))
    names = history.trend(entries, args.out)
    print(f"{PROG}: trend of {len(names)} figures over {len(entries)} runs written to {args.out}")
    return 0


def scale(args) -> int:
    try:
        base = baselines.load(args.baseline)
    except baselines.BaselineError as exc:
        return _fail(str(exc))
    baselines.scaled(base, args.factor).write(args.out)
    print(f"{PROG}: {args.out}: {args.baseline} with every gated figure x {args.factor:g}")
    return 0


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog=f"python -m {PROG}", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = top.add_subparsers(dest="command", required=True)

    rec = sub.add_parser("record", help="run the regression set N times; write each figure's best as the baseline")
    rec.add_argument("--out", type=Path, required=True, help="the baseline file to write")
    rec.add_argument("--impl", help="measure this target's or adapter's protocol saver (default: impl's dcp:impl)")
    rec.add_argument("--runs", type=int, default=5, help="runs of the set (default 5)")
    rec.add_argument("--size-mib", type=float, default=Settings.size_mib, help="state dict size (default 8)")
    rec.add_argument("--rounds", type=int, default=Settings.rounds, help="timed rounds per benchmark (default 7)")
    rec.add_argument("--threads", type=int, default=Settings.threads, help="trainer's torch threads (default 1)")
    rec.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments, kept in the baseline")
    rec.set_defaults(func=record)

    cmp_ = sub.add_parser(
        "compare", help="run the regression set once and compare with a baseline file, or (--against) the paired gate"
    )
    cmp_.add_argument("baseline", type=Path, nargs="?", help="the baseline file (from `record`)")
    cmp_.add_argument(
        "--threshold",
        help=f"fail above this factor of the baseline (default: ${comparing.THRESHOLD_ENV}, else "
        f"{comparing.DEFAULT_THRESHOLD:g}; with --against: when the whole 90%% interval lies above it, default "
        f"{paired_gate.DEFAULT_THRESHOLD:g})",
    )
    cmp_.add_argument(
        "--against", help="paired gate: the baseline is this commit of --repo, or this Python interpreter's install"
    )
    cmp_.add_argument("--impl", help="with --against: the adapter measured (default: impl)")
    cmp_.add_argument("--baseline-impl", help="with --against: the baseline side's adapter (default: --impl)")
    cmp_.add_argument(
        "--baseline-env", action="append", default=[], metavar="NAME=VALUE", help="with --against: for that side only"
    )
    cmp_.add_argument(
        "--current-env", action="append", default=[], metavar="NAME=VALUE", help="with --against: for that side only"
    )
    cmp_.add_argument("--repo", type=Path, default=ROOT, help="with --against COMMIT: the git checkout (default: this)")
    cmp_.add_argument("--pairs", type=int, default=20, help="with --against: interleaved pairs (default 20)")
    cmp_.add_argument("--size-mib", type=float, default=32, help="with --against: state dict size (default 32)")
    cmp_.add_argument("--tensors", type=int, default=64, help="with --against: tensors it holds (default 64)")
    cmp_.add_argument("--no-count", action="store_true", help="with --against: skip the counted costs (strace)")
    cmp_.add_argument(
        "--device",
        choices=sides.DEVICES,
        default="cpu",
        help="with --against: where both sides' tensors live (cuda: cuda:0; refused without a GPU)",
    )
    cmp_.add_argument("--json-out", type=Path, help="with --against: write every round and count as JSON here")
    cmp_.add_argument("--history", type=Path, help="append this run's figures to this JSON-lines file")
    cmp_.add_argument("--commit", help="the commit the history names (default: the git commit of this checkout)")
    cmp_.add_argument("--run", type=Path, help="compare this pytest-benchmark JSON instead of running the set")
    cmp_.add_argument("--action-json", type=Path, help="write github-action-benchmark's customSmallerIsBetter JSON")
    cmp_.add_argument("--summary", type=Path, help="append the Markdown verdict here ($GITHUB_STEP_SUMMARY)")
    cmp_.add_argument("--keep-run", type=Path, help="keep the run's pytest-benchmark JSON here")
    cmp_.set_defaults(func=compare)

    tr = sub.add_parser("trend", help="draw each figure of a history over its runs (PNG; matplotlib)")
    tr.add_argument("history", type=Path)
    tr.add_argument("--out", type=Path, default=Path("regression-trend.png"))
    tr.set_defaults(func=trend)

    sc = sub.add_parser("scale", help="a copy of a baseline with every gated figure times FACTOR (0.1: check the gate)")
    sc.add_argument("baseline", type=Path)
    sc.add_argument("factor", type=float)
    sc.add_argument("--out", type=Path, required=True)
    sc.set_defaults(func=scale)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if getattr(args, "runs", 1) < 1:
        return _fail("--runs must be at least 1")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
