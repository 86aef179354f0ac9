"""The GPU run (gpu_run, docs/gpu.md) stays runnable without a GPU to try it on: its plan fits the device calls, its
releases are the release list's (ckptspec/report/releases.py), and a dry run of a stage goes from set-up to "skipped: no GPU" through the real code."""

from __future__ import annotations

import ast
import json
import re
import tarfile
from pathlib import Path

import pytest

from ckptspec.report import clauses, releases
from ckptspec.spec.harness.surface.loading import builtin_targets
from gpu_run import __main__ as cli
from gpu_run import plan, runner


def test_every_stage_is_in_one_call_and_every_call_fits_a_device_command():
    names = [stage.name for stage in plan.STAGES]
    assert len(names) == len(set(names)), names
    in_calls = [name for call in plan.CALLS for name in call]
    assert sorted(in_calls) == sorted(names), "each stage belongs to exactly one call"
    assert in_calls == names, "calls take the stages in their order of importance"
    for number in range(1, len(plan.CALLS) + 1):
        total = plan.call_seconds(plan.call_stages(number))
        if number == plan.LEASE_CALL:  # its last batch takes what the deadline leaves
            continue
        limit = plan.LEASE_DEADLINE_S if number in plan.LEASE_SIZED else plan.CALL_LIMIT_S
        assert total <= limit, f"call {number} needs {total} s"
    assert sum(plan.call_seconds(plan.call_stages(n)) for n in (1, 2, 3)) <= 28 * 60
    lease = plan.call_stages(plan.LEASE_CALL)
    assert {s.target for s in lease if s.together} == {s.target for s in plan.STAGES if s.name.endswith("-gpu")}
    # The lease call: the suite and the benchmarks within its deadline, the GPU selections with what is left; the
    # deadline leaves a 15-minute lease about 7 minutes for the machine's start and the results' way back.
    suite, bench = lease[:2]
    assert (suite.args, bench.record) == (("-n", "auto", *plan.COMMON), "benchmark"), "the README's command first"
    assert plan.SETUP_S + suite.budget_s + bench.budget_s <= plan.LEASE_DEADLINE_S <= 8 * 60


def test_together_stages_share_one_batch_and_the_others_run_alone():
    lease = plan.call_stages(plan.LEASE_CALL)
    batches = plan.batches(lease)
    assert [len(b) for b in batches] == [1, 1, 9]
    assert plan.call_seconds(lease) == plan.SETUP_S + sum(max(s.budget_s for s in b) for b in batches)


def test_stages_name_known_targets_and_the_releases_of_the_release_list():
    listed = {release.name for release in releases.RELEASES if release.distribution != "torch"}
    assert set(plan.RELEASES) | set(plan.NOT_YET_ON_GPU) == listed
    assert not set(plan.RELEASES) & set(plan.NOT_YET_ON_GPU)
    assert {f"{target}-gpu" for target in plan.DCP_TARGETS} <= set(plan.BY_NAME)
    known = builtin_targets()
    for stage in plan.STAGES:
        assert stage.target in known, stage
        assert stage.without_gpu in ("run", "collect")
        assert stage.record in ("conformance", "benchmark", "sweep")
        assert all(release in plan.RELEASES for release in stage.releases), stage
    for name, release in plan.RELEASES.items():
        assert name == f"{release.target}-{release.version}"
        assert f"{name}-gpu" in plan.BY_NAME
        assert f"{name}-full" in plan.BY_NAME


def test_every_test_of_the_snapshot_family_follows_the_tensor_device():
    """Each test citing a `snapshot = true` clause is marked `tensor_device` (its state on --tensor-device) or `gpu`
    (CUDA tensors always): the GPU stages select the family with `-m "gpu or tensor_device"`."""
    family = {cid for cid, clause in clauses.load().items() if clause.get("snapshot")}
    assert family, "no clause is marked snapshot = true"
    seen, unmarked = set(), []
    for path in sorted((plan.ROOT / "ckptspec/spec").rglob("test_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef):
                continue
            marks = [ast.unparse(d) for d in node.decorator_list]
            cited = {c for m in marks if m.startswith("pytest.mark.spec(") for c in ast.literal_eval(m[17:-1] + ",")}
            if cited & family:
                seen |= cited & family
                if not {"pytest.mark.tensor_device", "pytest.mark.gpu"} & set(marks):
                    unmarked.append(f"{path.relative_to(plan.ROOT)}::{node.name}")
    assert not unmarked, unmarked
    assert seen == family, f"snapshot clauses no test cites: {sorted(family - seen)}"


def test_requirements_split_into_groups_without_what_the_machine_provides():
    groups = plan.project_requirements()
    names = {plan.distribution_name(r) for group in groups.values() for r in group}
    assert not names & set(plan.MACHINE_PROVIDES)
    assert {plan.distribution_name(r) for r in groups["s3"]} == set(plan.S3_DISTRIBUTIONS)
    assert "pytest" in {plan.distribution_name(r) for r in groups["base"]}


def test_counts_and_verdicts_read_from_a_log():
    log = "SKIPPED [3] ckptspec/spec/x.py:1: CUDA tensors requested (--tensor-device cuda) but no GPU\n"
    log += "SKIPPED [2] ckptspec/spec/y.py:4: target 'mcore' lacks storage_writer\n5 skipped in 2.31s\n"
    stage = plan.BY_NAME["mcore-0.16.1-gpu"]
    assert runner._counts(log) == {"skipped": 5}
    assert runner._judge(stage, log, 0, gpu_mode=False, collect_only=False) == (
        "skipped: no GPU (5 skipped, 2 for a capability the target lacks)",
        False,
    )
    ran = log.replace("5 skipped", "1 passed, 5 skipped")
    assert runner._judge(stage, ran, 0, gpu_mode=False, collect_only=False)[1], "a test that ran without a GPU"
    assert runner._judge(stage, "1 failed, 2 passed in 3.0s\n", 1, gpu_mode=True, collect_only=False) == (
        "failed tests (verdicts in the JSON)",
        False,
    )
    assert runner._judge(stage, "", 4, gpu_mode=True, collect_only=False)[1]
    assert runner._judge(stage, "12 tests collected in 1.0s\n", 0, gpu_mode=False, collect_only=True) == (
        "collected 12 tests (no GPU: not run)",
        False,
    )


def test_a_bad_call_number_is_refused(capsys):
    assert cli.main(["run", "--call", str(len(plan.CALLS) + 1), "--dry-run"]) == 2
    assert "the calls are 1 to" in capsys.readouterr().err


def test_dry_run_of_a_stage_reaches_the_skips_for_lack_of_a_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the dry run would only be forced (--dry-run); the real run is docs/gpu.md's")
    # A wheelhouse whose base group lists the real requirements and holds no wheel: this test's environment has them
    # all, so pip's dry run against it must find nothing missing (and reach no index).
    base = tmp_path / "wheelhouse" / "base"
    base.mkdir(parents=True)
    (base / "group.json").write_text(json.dumps({"requirements": plan.project_requirements()["base"]}))
    selection = ("ckptspec/spec/protocol/test_snapshot.py", "-p", "no:randomly", "-q", "-n", "2")
    stages = [plan.Stage("snapshot-cuda", 120, "impl", (*selection, *plan.GPU_SELECTION))]
    out = tmp_path / "out"
    problems = runner.run_stages(
        stages,
        python=cli.sys.executable,
        wheelhouse=tmp_path / "wheelhouse",
        work=tmp_path / "work",
        out=out,
        dry_run=True,
        deadline_s=None,
        log=lambda line: None,
    )
    summary = json.loads((out / "summary.json").read_text())
    assert problems == 0, summary
    assert summary["set_up"] == {"base": "nothing missing"}
    (cuda,) = summary["stages"]
    assert re.match(r"skipped: no GPU \(\d+ skipped", cuda["status"]), cuda
    assert "-n 0" in (out / "snapshot-cuda.log").read_text().splitlines()[0], "without a GPU: in one process"
    archive = runner.pack(out, "probe")
    assert sorted(p.name for p in out.iterdir()) == ["probe.tar.gz", "summary.json", "summary.md"]
    with tarfile.open(archive) as tar:
        assert set(tar.getnames()) == {"snapshot-cuda.log", "snapshot-cuda.json"}
    assert Path(out / "summary.md").read_text().count("| snapshot-cuda |") == 1


def test_results_name_harness_failures_and_never_charge_them_to_the_target(tmp_path):
    """A stored GPU run's table (gpu_run.results): a failure the harness caused reads "not judged", others keep
    their verdicts, and a test a stage never reached reads so."""
    from gpu_run import results

    machine = {"gpu": "GPU X", "torch": "2.0", "cuda": "13.0", "python": "3.12"}
    (tmp_path / "summary.json").write_text(json.dumps({"machine": machine}))
    tests = [
        {"nodeid": "ckptspec/spec/a.py::test_ok", "outcome": "passed", "clauses": ["P-SNAP-1"]},
        {
            "nodeid": "ckptspec/spec/a.py::test_wait",
            "outcome": "failed",
            "clauses": ["P-SNAP-2"],
            "failure": {"text": "GpuWaitTimeout: harness: 1 GPU(s) did not become free within 120 s"},
        },
        {
            "nodeid": "ckptspec/spec/a.py::test_bug",
            "outcome": "failed",
            "clauses": ["P-ISO-1"],
            "message": "RankFailures: 2 of 2 ranks failed:\n    KeyError: <class 'type'>",
        },
        {
            "nodeid": "ckptspec/spec/a.py::test_listed",
            "outcome": "xfail",
            "clauses": ["P-STAGED-1"],
            "entry": {"clauses": ["P-STAGED-1"]},
            "failure": {"text": "AssertionError: 13 but should be 12"},
        },
        {
            "nodeid": "ckptspec/spec/a.py::test_group",
            "outcome": "failed",
            "clauses": ["P-SNAP-2"],
            "failure": {"text": "AssertionError: A CPU backend must be enabled for async save\nKeyError: 'saver'"},
        },
        {"nodeid": "ckptspec/spec/a.py::test_flaky", "outcome": "xpass", "clauses": ["P-ISO-1"]},
    ]
    run = {"target": "t", "version": "1", "clauses": {}, "tensor_device": "cuda"}
    (tmp_path / "t1-lease.json").write_text(json.dumps({**run, "tests": tests}))
    (tmp_path / "t2-lease.json").write_text(json.dumps({**run, "tests": tests[:1]}))
    text = results.render(tmp_path)
    rows = {
        line.split("|")[1].strip(" `"): line.split("|")[3:5] for line in text.splitlines() if line.startswith("| `")
    }
    assert [c.strip() for c in rows["test_ok"]] == ["passes", "passes"]
    assert rows["test_wait"][0].strip().startswith("not judged: harness")
    assert rows["test_bug"][0].strip().startswith("FAILS (not listed)")
    assert rows["test_listed"][0].strip().startswith("fails as listed")
    assert rows["test_group"][0].strip().startswith("not judged: harness")
    assert rows["test_flaky"][0].strip() == "passes (listed as an intermittent failure)"
    assert rows["test_bug"][1].strip() == "not reached"
    assert "KeyError: <class 'type'>" in text
    assert "charged to P-STAGED-1: AssertionError" in text
    assert "GPU X, torch 2.0" in text


def test_the_sweep_call_measures_every_peer_on_the_gpu_within_a_lease():
    """Call SWEEP_CALL: the size and rank sweeps (ckptspec/bench/sweep.py) of every peer, CUDA tensors, within a
    lease's deadline; its command is the sweep's own command line, with where to write and its own budget."""
    from ckptspec.bench import sweep

    stages = plan.call_stages(plan.SWEEP_CALL)
    assert [s.name for s in stages] == ["sweep-ranks", "sweep-ranks-cpu", "sweep-size"]
    assert plan.call_seconds(stages) <= plan.LEASE_DEADLINE_S <= plan.CALL_LIMIT_S
    labels = [sweep.parse_peer(peer).label for peer in plan.SWEEP_PEERS]
    assert len(labels) == len(set(labels))
    releases_named = {f"{r.name}" for r in releases.benchmark_peers()}
    assert {"impl", "impl-overlapped", "dcp.save", "dcp-thread", "dcp-pinned", "dcp-staged"} | releases_named == set(
        labels
    )
    ranks_cpu = runner.stage_command("python3", stages[1], Path("/out"), gpu_mode=True, collect_only=False)
    assert ranks_cpu[ranks_cpu.index("--device") + 1] == "cpu", "impl's rank goal is a CPU one (issue 62)"
    assert ranks_cpu[ranks_cpu.index("--values") + 1] == "1,2,4"
    size = stages[2]
    assert size.rest, "the size sweep takes what the ranks sweep leaves"
    assert size.releases == plan.BENCH_RELEASES
    assert size.releases_optional, "a release this Python cannot install skips its peer, not the stage"
    out = Path("/out")
    gpu = runner.stage_command("python3", size, out, gpu_mode=True, collect_only=False, budget_s=300)
    assert gpu[:5] == ["python3", "-m", "ckptspec.bench.sweep", "run", "--axis"]
    assert gpu[gpu.index("--device") + 1] == "cuda"
    assert gpu[gpu.index("--values") + 1] == "64,256,1024,4096,16384"
    assert gpu[gpu.index("--out") + 1] == "/out/sweep-size.json"
    assert gpu[gpu.index("--table-out") + 1] == "/out/sweep-size.md"
    assert gpu[gpu.index("--budget-s") + 1] == str(300 - plan.COMMAND_MARGIN_S), "it stops before the runner's SIGINT"
    assert "--plan-only" not in gpu
    dry = runner.stage_command("python3", size, out, gpu_mode=False, collect_only=False)
    assert dry[-1] == "--plan-only"
    args = sweep.parser().parse_args(dry[3:])
    assert (args.fit_memory, args.min_rounds, args.device) == (True, 3, "cuda")
    ranks = sweep.parser().parse_args(runner.stage_command("p", stages[0], out, True, False)[3:])
    assert (ranks.axis, ranks.min_points) == ("ranks", 2)


def test_a_command_stage_is_judged_by_its_exit_and_counted_from_its_json(tmp_path):
    assert runner._judge_command("sweep: size 64\n", 0, dry=False) == ("measured", False)
    assert runner._judge_command("", 0, dry=True) == ("planned (no GPU: not run)", False)
    status, problem = runner._judge_command("x\nsweep: --device cuda: no CUDA device here\n", 2, dry=False)
    assert problem
    assert status == "error: exit 2: sweep: --device cuda: no CUDA device here"
    run = {"points": [{"value": 64}, {"value": 256, "cut": True}], "left_out": [[16384, "memory"]], "skipped": {}}
    (tmp_path / "s.json").write_text(json.dumps(run))
    assert runner._command_counts(tmp_path / "s.json") == {"points": 2, "cut": 1, "left out": 1}
    assert runner._command_counts(tmp_path / "absent.json") == {}
