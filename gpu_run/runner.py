"""Running the stages on the machine: set-up, each stage within its budget, the summary, the results packed.

Contract of `run_stages`:
- Set-up first (wheels.install of the groups the stages need; a probe of the Python: torch, CUDA, the GPU), then
  each stage in order; consecutive `together` stages start at the same time, each within its own budget. A stage whose wheel group is absent, or whose target does not import as the release it
  names, is not started, with the reason; the others still run.
- A stage runs `python -m pytest <args> --impl <target>` with its JSON under `out` (`<stage>.json`) and its output
  in `<stage>.log`, interrupted (SIGINT, so that pytest still writes its reports; SIGKILL 30 s later) at its
  budget or at the call's deadline, whichever comes first; a stage that would start with less than a minute
  left is not started.
- Without a GPU, or with `dry_run`, a stage runs only what skips there (`without_gpu == "run"`: it must end with
  every test skipped for lack of a GPU, or for a capability its target lacks) and otherwise collects its tests,
  within at least DRY_BUDGET_S (a slow machine's collection, not the GPU run, is what it waits for then); a dry
  run on a machine with a GPU collects every stage.
- A stage with a `command` (the GPU sweeps) runs `python <command> --out <stage>.json --table-out <stage>.md
  --budget-s B` (B: its budget less plan.COMMAND_MARGIN_S; the command stops itself and writes what it has), and
  without a GPU or with `dry_run` the same with the stage's `dry_args` (`--plan-only`: what it would run, every
  peer's adapter loaded or named as skipped), which must exit 0. Its counts are the points it measured, left out
  and cut, and the peers it skipped. A stage marked `rest` runs, under a call's deadline, for what the deadline
  leaves.
- `summary.json` and `summary.md` in `out` say, per stage, its status, time, budget and test counts; the return
  value is the number of problems (a set-up failure, a pytest error, an unexpected skip), not failing tests, which
  are verdicts recorded in the JSON.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tarfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path

from gpu_run import plan, wheels

PROBE = (
    "import json, sys, torch; c = torch.cuda.is_available(); print(json.dumps({'python': sys.version.split()[0], "
    "'executable': sys.executable, 'torch': torch.__version__, 'cuda': torch.version.cuda, "
    "'gpu': torch.cuda.get_device_name() if c else None, 'gpus': torch.cuda.device_count() if c else 0}))"
)
VERSION = "from ckptspec.spec.harness.surface.loading import load_target; print(load_target({!r}).version)"
NO_GPU_REASONS = ("but no GPU", "needs a CUDA device")
CAPABILITY_REASON = "lacks"
MIN_START_S = 60
DRY_BUDGET_S = 120  # without a GPU a stage only collects and skips: its budget is a floor against a slow machine
GRACE_S = 30


@dataclass
class Result:
    stage: str
    status: str
    problem: bool = False
    seconds: float = 0.0
    budget_s: int = 0
    exit_code: int | None = None
    counts: dict[str, int] = field(default_factory=dict)


def probe(python: str) -> dict:
    """The Python that runs the stages: its version, torch, CUDA and GPU (SetupError if torch does not import)."""
    done = subprocess.run([python, "-c", PROBE], capture_output=True, text=True)
    if done.returncode != 0:
        raise wheels.SetupError(f"{python} cannot import torch:\n{done.stderr.strip()[-800:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _counts(log: str) -> dict[str, int]:
    """pytest's closing counts ("3 passed, 2 skipped in 4.1s"), from the last such line of the log."""
    for line in reversed(log.strip().splitlines()[-30:]):
        if re.search(r"\bin [\d.]+s\b", line) and (pairs := re.findall(r"(\d+) (\w+)", line)):
            return {word: int(n) for n, word in pairs if not word.endswith("s") or word in ("errors", "warnings")}
    return {}


def _skip_reasons(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("SKIPPED")]


def _interrupt(proc: subprocess.Popen) -> None:
    """SIGINT to pytest (it writes its reports), then SIGKILL to its process group if it has not ended."""
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _end_leftovers(proc: subprocess.Popen) -> None:
    """End what a stage left running in its process group (a worker outliving its trainer holds GPU memory that the
    next stage would miss)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)


def stage_command(
    python: str,
    stage: plan.Stage,
    out: Path,
    gpu_mode: bool,
    collect_only: bool,
    work: Path | None = None,
    budget_s: float | None = None,
) -> list[str]:
    """The pytest command line of a stage; without a GPU in one process (-n 0), where nothing runs to share out.
    A `command` stage's line: its command with where to write, its own budget, and `dry_args` without a GPU."""
    if stage.command:
        budget = stage.budget_s if budget_s is None else budget_s
        own = max(budget - plan.COMMAND_MARGIN_S, 1.0)
        written = ["--out", str(out / f"{stage.name}.json"), "--table-out", str(out / f"{stage.name}.md")]
        dry = list(stage.dry_args) if collect_only or not gpu_mode else []
        return [python, *stage.command, *written, "--budget-s", f"{own:.0f}", *dry]
    args = list(stage.args)
    if not gpu_mode and "-n" in args:
        args[args.index("-n") + 1] = "0"
    record = "--conformance-json" if stage.record == "conformance" else "--benchmark-json"
    # A base temp of its own: pytest prunes old numbered base temps, which would be another stage's run together.
    command = [python, "-m", "pytest", *args, "--impl", stage.target]
    command += ["--basetemp", str(work / f"tmp-{stage.name}")] if work is not None else []
    return command + (["--collect-only"] if collect_only else [record, str(out / f"{stage.name}.json")])


def _command_counts(path: Path) -> dict[str, int]:
    """A sweep's counts from its JSON: points measured, cut by the budget, left out; peers skipped."""
    try:
        run = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    points = run.get("points", [])
    counts = {
        "points": len(points),
        "cut": sum(1 for p in points if p.get("cut")),
        "left out": len(run.get("left_out", [])),
        "peers skipped": len(run.get("skipped", {})),
    }
    return {k: v for k, v in counts.items() if v or k == "points"}


def _judge_command(log: str, rc: int, dry: bool) -> tuple[str, bool]:
    if rc != 0:
        last = next((line for line in reversed(log.strip().splitlines()) if line.strip()), "")
        return f"error: exit {rc}: {last[-200:]}", True
    return ("planned (no GPU: not run)", False) if dry else ("measured", False)


def _judge(stage: plan.Stage, log: str, rc: int, gpu_mode: bool, collect_only: bool) -> tuple[str, bool]:
    counts = _counts(log)
    if collect_only:
        collected = re.findall(r"(\d+) tests? collected", log)
        return (
            (f"collected {collected[-1]} tests (no GPU: not run)", False)
            if rc == 0 and collected
            else (
                f"error: collection ended with exit {rc}",
                True,
            )
        )
    if rc == 5:
        return "error: the selection holds no test", True
    if gpu_mode:
        verdict = {0: "passed", 1: "failed tests (verdicts in the JSON)"}.get(rc)
        return (verdict, False) if verdict else (f"error: pytest exit {rc}", True)
    reasons = _skip_reasons(log)
    others = [r for r in reasons if not any(k in r for k in (*NO_GPU_REASONS, CAPABILITY_REASON))]
    ran = {k: v for k, v in counts.items() if k not in ("skipped", "deselected", "warnings")}
    if rc != 0 or ran or others:
        return f"error: without a GPU it should only skip (exit {rc}, {ran or others[:3]})", True
    lacking = sum(int(n) for r in reasons if CAPABILITY_REASON in r for n in re.findall(r"SKIPPED \[(\d+)\]", r))
    note = f", {lacking} for a capability the target lacks" if lacking else ""
    return f"skipped: no GPU ({counts.get('skipped', 0)} skipped{note})", False


def run_stage(
    python: str, stage: plan.Stage, work: Path, out: Path, budget: float, gpu_mode: bool, collect: bool = False
) -> Result:
    """One stage: on the GPU (`gpu_mode`), or as without one; `collect`: collect only, whatever the stage."""
    collect_only = collect or (not gpu_mode and stage.without_gpu == "collect")
    env = {
        **os.environ,
        "PYTHONPATH": wheels.pythonpath(work, stage.releases),
        "PYTHONUNBUFFERED": "1",
        "HYPOTHESIS_PROFILE": "ci",
        # Stages run together queue for the one GPU: a test may wait for it as long as its stage may run.
        **({"CKPTSPEC_GPU_WAIT_S": str(int(budget))} if stage.together else {}),
        **dict(stage.env),
    }
    log_path = out / f"{stage.name}.log"
    if stage.command:
        collect_only = collect or not gpu_mode
    command = stage_command(python, stage, out, gpu_mode, collect_only, work, budget)
    start = time.monotonic()
    timed_out = False
    with open(log_path, "w") as log:
        log.write(f"$ {' '.join(command)}\n")
        log.flush()
        proc = subprocess.Popen(
            command, cwd=plan.ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            rc = proc.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            timed_out = True
            _interrupt(proc)
            rc = proc.returncode
        _end_leftovers(proc)
    seconds = round(time.monotonic() - start, 1)
    text = log_path.read_text(errors="replace")
    if timed_out:
        status, problem = f"budget exceeded: interrupted after {budget:.0f} s (partial results)", False
    elif stage.command:
        status, problem = _judge_command(text, rc, collect_only)
    else:
        status, problem = _judge(stage, text, rc, gpu_mode, collect_only)
    counts = _command_counts(out / f"{stage.name}.json") if stage.command else _counts(text)
    if stage.command and status == "measured" and not counts.get("points"):
        status = "measured nothing (every point left out, or no peer could start: see the log)"
    return Result(stage.name, status, problem, seconds, stage.budget_s, rc, counts)


def _check_target(python: str, stage: plan.Stage, work: Path, checked: dict) -> str | None:
    """Why the stage's target cannot run (it does not import, or imports another release), else None."""
    key = (stage.target, stage.releases)
    if key not in checked:
        env = {**os.environ, "PYTHONPATH": wheels.pythonpath(work, stage.releases)}
        done = subprocess.run(
            [python, "-c", VERSION.format(stage.target)], cwd=plan.ROOT, env=env, capture_output=True, text=True
        )
        lines = done.stdout.strip().splitlines()
        version = lines[-1] if lines else "(no output)"
        want = [plan.RELEASES[r].version for r in stage.releases if plan.RELEASES[r].target == stage.target]
        if done.returncode != 0:
            checked[key] = f"target {stage.target} does not import: {done.stderr.strip()[-600:]}"
        elif want and version != want[0]:
            checked[key] = f"target {stage.target} imports version {version}, not {want[0]}"
        else:
            checked[key] = None
    return checked[key]


def run_stages(
    stages: list[plan.Stage],
    *,
    python: str,
    wheelhouse: Path,
    work: Path,
    out: Path,
    dry_run: bool,
    deadline_s: float | None,
    log=print,
) -> int:
    start = time.monotonic()
    out.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    summary: dict = {"stages": [], "dry_run": dry_run}
    results: list[Result] = []
    try:
        summary["machine"] = probe(python)
        summary["set_up"] = wheels.install(python, wheelhouse, work, plan.call_groups(stages), log)
    except wheels.SetupError as exc:
        summary["set_up_error"] = str(exc)
        log(f"set-up failed: {exc}")
        _write_summary(out, summary, results)
        return 1
    gpu_mode = bool(summary["machine"]["gpu"]) and not dry_run
    python_version = summary["machine"]["python"]
    log(f"machine: {summary['machine']}; {'running on the GPU' if gpu_mode else 'no GPU run (set-up checks only)'}")
    checked: dict = {}

    def start_or_skip(stage: plan.Stage) -> Callable[[], Result]:
        left = None if deadline_s is None else deadline_s - (time.monotonic() - start)
        needed = [g for g in stage.groups if not (stage.releases_optional and g in stage.releases)]
        absent = [g for g in needed if summary["set_up"].get(g) == "absent from the wheelhouse"]
        unusable = [g for g in needed if summary["set_up"].get(g, "").startswith(wheels.NOT_INSTALLABLE)]
        reason = None
        if absent:
            reason = f"not started: wheel group {', '.join(absent)} absent from the wheelhouse"
        elif unusable:
            reason = f"not started: {', '.join(unusable)} {wheels.NOT_INSTALLABLE} (Python {python_version})"
        elif left is not None and left < MIN_START_S:
            reason = f"not started: {left:.0f} s left of the call"
        elif problem := _check_target(python, stage, work, checked):
            reason = f"set-up failed: {problem}"
        if reason:
            return lambda: Result(stage.name, reason, reason.startswith("set-up"), budget_s=stage.budget_s)
        budget: float = stage.budget_s if gpu_mode else max(stage.budget_s, DRY_BUDGET_S)
        budget = budget if left is None else (left - GRACE_S if stage.rest else min(budget, left - GRACE_S))
        # A dry run on a machine with a GPU collects only: its GPU-only tests would run there, not skip.
        collect = dry_run and bool(summary["machine"]["gpu"])
        return lambda: run_stage(python, stage, work, out, budget, gpu_mode, collect)

    for batch in plan.batches(stages):
        jobs = [start_or_skip(stage) for stage in batch]
        with ThreadPoolExecutor(max_workers=len(jobs)) as pool:
            batch_results = list(pool.map(lambda job: job(), jobs))
        for stage, result in zip(batch, batch_results, strict=True):
            results.append(result)
            log(f"{stage.name}: {result.status} [{result.seconds:.0f} s of {stage.budget_s} s] {result.counts or ''}")
    _write_summary(out, summary, results)
    return sum(r.problem for r in results)


def _write_summary(out: Path, summary: dict, results: list[Result]) -> None:
    summary["stages"] = [asdict(r) for r in results]
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    lines = [f"machine: {summary.get('machine')}", f"set-up: {summary.get('set_up') or summary.get('set_up_error')}"]
    lines += ["", "| stage | status | seconds | budget | counts |", "| --- | --- | --- | --- | --- |"]
    for r in results:
        counts = ", ".join(f"{n} {k}" for k, n in r.counts.items())
        lines.append(f"| {r.stage} | {r.status} | {r.seconds:.0f} | {r.budget_s} | {counts} |")
    (out / "summary.md").write_text("\n".join(lines) + "\n")


def pack(out: Path, name: str) -> Path:
    """Everything in `out` but the summaries, moved into `out/<name>.tar.gz` (a device call returns 8 files)."""
    archive = out / f"{name}.tar.gz"
    members = [p for p in sorted(out.iterdir()) if p.is_file() and not p.name.startswith("summary.") and p != archive]
    with tarfile.open(archive, "w:gz") as tar:
        for path in members:
            tar.add(path, arcname=path.name)
    for path in members:
        path.unlink()
    return archive
