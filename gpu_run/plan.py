"""What the GPU run does: its stages, each stage's time budget, and the device calls that group them.

A stage is one pytest run against one target, with a budget in seconds after which it is interrupted (its
partial results kept). Stages are listed most important first: the GPU-marked tests and the snapshot family with
CUDA tensors on impl, then the same on every NVRx and Megatron-Core release and the DCP targets, then the GPU
benchmarks, then the full suites. A *call* is a group of stages that fits one command of a lent device machine
(600 s, less `CALL_LIMIT_S`'s margin, with `SETUP_S` for the set-up every call repeats); calls 1 to 3 fit one
30-minute session of device time, calls 4 to 7 (the releases' full suites) a later one. Nothing here needs more
than the standard library (the release list, ckptspec.report.releases, included): the driver runs on the GPU
machine's own Python before anything is installed.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path

from ckptspec.report import releases as release_list
from ckptspec.report.releases import Release

ROOT = Path(__file__).resolve().parent.parent
CALL_LIMIT_S = 570  # a device command runs at most 600 s; the rest is for packing the results
TOGETHER_WORKERS = 2  # xdist workers of each stage run `together` (8 such stages on a 16-core machine)
SETUP_S = 60  # installing from the wheelhouse and checking every target imports, in each call
# The selection that needs a GPU: GPU-marked tests, and the snapshot family with the trainer's state on the GPU.
GPU_SELECTION = ("-m", "gpu or tensor_device", "--tensor-device", "cuda")
COMMON = ("-q", "-p", "no:randomly")
# Wheel groups of the wheelhouse besides the releases: `base` for every stage, `s3` (moto's S3 server on loopback,
# boto3) only for the full suites, which hold the object-store tests.
S3_DISTRIBUTIONS = ("moto", "flask", "flask-cors", "boto3")
# Installed with torch on any machine that has it (torch's own dependencies), or too large to carry (numpy, which
# every torch image holds): never downloaded, and the set-up fails with their name if the machine lacks one.
# (filelock is carried: the H200 image's was older than multi-storage-client needs.)
MACHINE_PROVIDES = (
    "torch",
    "numpy",
    "sympy",
    "mpmath",
    "networkx",
    "jinja2",
    "markupsafe",
    "fsspec",
    "typing-extensions",
    "setuptools",
    "triton",
)


# The library releases a GPU run installs from their wheels (ckptspec/report/releases.py, `gpu`), by name, and the
# listed releases it does not install yet; the DCP configurations run on the GPU machine's own torch.
RELEASES: dict[str, Release] = {r.name: r for r in release_list.RELEASES if r.gpu and r.distribution != "torch"}
NOT_YET_ON_GPU = tuple(r.name for r in release_list.RELEASES if not r.gpu)
GPU_BUDGET_S = {"nvrx": 75}  # a release's GPU-selection stage, by target (60 s otherwise)
DCP_TARGETS = tuple(dict.fromkeys(r.target for r in release_list.RELEASES if r.gpu and r.distribution == "torch"))
# The releases the benchmarks' NVRx and Megatron-Core peers use.
BENCH_RELEASES = tuple(r.name for r in release_list.benchmark_peers())


@dataclass(frozen=True)
class Stage:
    """One pytest run: `args` against `target`, within `budget_s` seconds.

    `releases`: wheel groups put on the path (the target's release first). `without_gpu`: what the stage does on a
    machine without a GPU, or with --dry-run: "run" when every test it selects skips there (it must end in those
    skips), "collect" when it would run CPU work instead (it collects its tests only). `record`: the JSON it
    writes, "conformance" (--conformance-json) or "benchmark" (--benchmark-json). `s3`: needs the s3 wheel group.
    `releases_optional`: a release the machine's Python cannot install is left off the path instead of stopping the
    stage (the benchmarks' NVRx and Megatron-Core peers then skip, saying why).
    `together`: run at the same time as the other `together` stages of its call (each with `-n TOGETHER_WORKERS`):
    the GPU-selection stages spend their time starting persistent workers, not on the GPU or the CPUs.
    `env`: (name, value) pairs set for the stage's pytest (impl's overlapped staging: `CKPTSPEC_IMPL_STAGING`).
    `command`: a stage that is no pytest run: the Python's arguments instead (`python -m ckptspec.bench.sweep run
    ...`, `sweep_stage`), to which the runner adds `--out <stage>.json --table-out <stage>.md --budget-s B` (B:
    the stage's budget less COMMAND_MARGIN_S, so that it stops itself and writes what it has before the runner's
    SIGINT), and, without a GPU or with --dry-run, `dry_args` instead of measuring (the sweep's `--plan-only`).
    """

    name: str
    budget_s: int
    target: str
    args: tuple[str, ...]
    releases: tuple[str, ...] = ()
    without_gpu: str = "run"
    record: str = "conformance"
    s3: bool = False
    together: bool = False  # starts with the call's other `together` stages, at once (see runner.run_stages)
    releases_optional: bool = False  # runs without a release this Python cannot install (its peers then skip)
    env: tuple[tuple[str, str], ...] = ()  # environment variables the stage's pytest gets besides the runner's
    command: tuple[str, ...] = ()  # not pytest: these arguments of the Python (see above)
    rest: bool = False  # under a call's deadline, its budget is what the deadline leaves (budget_s in call_seconds)
    dry_args: tuple[str, ...] = ("--plan-only",)  # appended to `command` without a GPU or with --dry-run

    @property
    def groups(self) -> tuple[str, ...]:
        """The wheelhouse groups this stage needs."""
        return ("base", *(("s3",) if self.s3 else ()), *self.releases)


# impl's own CUDA checks of its staging, overlapped and default (gpu-marked), run with impl's GPU selection.
IMPL_GPU_PATHS = (
    "ckptspec/bench/test_overlap.py",
    "ckptspec/bench/test_landing.py",
    "ckptspec/bench/test_poll_device_wait.py",
)
OVERLAPPED = (("CKPTSPEC_IMPL_STAGING", "overlapped"),)  # impl's protocol saver stages in the background


def _gpu_stage(
    name: str,
    budget_s: int,
    target: str,
    release: str | None = None,
    together: bool = False,
    env: tuple[tuple[str, str], ...] = (),
) -> Stage:
    paths: tuple[str, ...] = (
        ("ckptspec/spec/protocol",) if target.startswith("dcp-") else ("ckptspec/spec", "ckptspec/faults")
    )
    if target == "impl":
        paths += IMPL_GPU_PATHS
    # worksteal: with two workers, the two slow persistent-queue tests must not queue behind each other.
    workers = (str(TOGETHER_WORKERS), "--dist", "worksteal") if together else ("auto",)
    args = (*paths, "-n", *workers, *GPU_SELECTION, *COMMON)
    return Stage(name, budget_s, target, args, (release,) if release else (), together=together, env=env)


def _bench_d2h(name: str, budget_s: int, sweep: str, rounds: int) -> Stage:
    args = ("ckptspec/bench/test_d2h.py", "--benchmark-enable", "-n", "0", "--bench-device", "cuda", *COMMON)
    return Stage(
        name,
        budget_s,
        "impl",
        (*args, "--bench-sweep-mib", sweep, "--bench-rounds", str(rounds)),
        BENCH_RELEASES,
        record="benchmark",
    )


def _bench_save(name: str, budget_s: int, size_mib: int, rounds: int, saves: int) -> Stage:
    args: tuple[str, ...] = ("ckptspec/bench/test_save.py", "--benchmark-enable", "-n", "0", "--bench-device", "cuda")
    args += (*COMMON, "--bench-size-mib", str(size_mib), "--bench-rounds", str(rounds), "--bench-saves", str(saves))
    return Stage(name, budget_s, "impl", args, BENCH_RELEASES, without_gpu="collect", record="benchmark")


def _full_stage(release: str) -> Stage:
    return Stage(
        f"{release}-full",
        480,
        RELEASES[release].target,
        ("ckptspec/spec", "ckptspec/faults", "-n", "auto", *COMMON),
        (release,),
        without_gpu="collect",
        s3=True,
    )


# The sweeps on the GPU (issue 60 item 7): what the CPU sweeps measure (docs/benchmarks.md, "Cost at scale"), with
# the trainer's tensors on the GPU: the size 64 MiB to 16 GiB and the ranks 1 to the GPUs present, for impl (and its
# overlapped staging), a synchronous dcp.save, DCP's thread async_save, its pinned and its staged configurations,
# and the benchmark releases of NVRx and Megatron-Core (a release this Python cannot install is skipped, saying
# why). The sweep leaves out what the machine's memory, disk or GPUs cannot hold (--fit-memory), sizes its rounds
# from a first measurement to fit the stage's budget (at least 3; what the budget cuts is the largest points' last
# rounds) and writes every point measured, each figure with its interval (ckptspec/bench/sweep.py).
SWEEP_PEERS = (
    "impl",
    "impl-overlapped=impl:CKPTSPEC_IMPL_STAGING=overlapped",
    "dcp.save=sync_dcp_adapter:PYTHONPATH=docs/examples",
    "dcp-thread",
    "dcp-pinned=ckptspec.bench.dcp_side:CKPTSPEC_DCP_STAGING=pinned",
    "dcp-staged=ckptspec.bench.dcp_side:CKPTSPEC_DCP_STAGING=staged",
    *(f"{r.name}={r.target}" for r in release_list.benchmark_peers()),
)
SWEEP_SIZES_MIB = (64, 256, 1024, 4096, 16384)
SWEEP_RANKS = (1, 2, 4, 8)
SWEEP_RANKS_CPU = (1, 2, 4)
SWEEP_TENSORS = 33  # as the stored CPU sweeps
SWEEP_MAX_ROUNDS = 20
COMMAND_MARGIN_S = 30  # of a command stage's budget: closing the last sides and writing the results


def sweep_stage(
    name: str,
    budget_s: int,
    axis: str,
    values: tuple[int, ...],
    *extra: str,
    device: str = "cuda",
    peers: tuple[str, ...] = SWEEP_PEERS,
) -> Stage:
    """A sweep of `peers` over `axis`, tensors on `device`, rounds sized to the budget."""
    args: tuple[str, ...] = (
        "-m",
        "ckptspec.bench.sweep",
        "run",
        "--axis",
        axis,
        "--values",
        ",".join(map(str, values)),
    )
    args += ("--tensors", str(SWEEP_TENSORS), "--device", device, "--fit-memory", "--no-count")
    args += ("--rounds", str(SWEEP_MAX_ROUNDS), "--min-rounds", "3", *extra)
    args += tuple(a for peer in peers for a in ("--peer", peer))
    return Stage(name, budget_s, "impl", (), BENCH_RELEASES, record="sweep", releases_optional=True, command=args)


SWEEP_STAGES: tuple[Stage, ...] = (
    # 1 GiB per rank; with one GPU a single point, which is no sweep: it says so in seconds and measures nothing,
    # and the size sweep after it takes the time left (`rest`).
    sweep_stage("sweep-ranks", 90, "ranks", SWEEP_RANKS, "--size-mib", "1024", "--min-points", "2"),
    # impl's rank goal of issue 62 (4 ranks within 10% of 1 at the same bytes per rank), CPU tensors over gloo: the
    # 2-core machine cannot give 4 ranks and their writers a core each; the GPU machine's 16 cores can.
    sweep_stage(
        "sweep-ranks-cpu",
        60,
        "ranks",
        SWEEP_RANKS_CPU,
        "--size-mib",
        "256",
        device="cpu",
        peers=("impl", "dcp.save=sync_dcp_adapter:PYTHONPATH=docs/examples"),
    ),
    replace(sweep_stage("sweep-size", 270, "size", SWEEP_SIZES_MIB), rest=True),
)


# The lease's stages (one device call of a 15-minute lease, LEASE_CALL), in order and within LEASE_DEADLINE_S: the
# README's `pytest -n auto` on impl to completion, alone (its time is a figure); then the ceilings, the D2H and the
# save benchmarks at 1 GiB for every peer in one process (the floors in the same run as the peers; rounds sized so
# that the stall of every peer comes first and what the budget cuts is kept); then, with the time left, the GPU
# selection on impl and the releases, together.
LEASE_DEADLINE_S = 480  # of a 15-minute lease: about a minute to start the machine, a margin to send results back
BENCH_LEASE_ARGS = (
    "ckptspec/bench/test_ceilings.py",
    "ckptspec/bench/test_d2h.py",
    "ckptspec/bench/test_save.py",
    "-k",
    "not first_save and not memory and not test_load and not pagecache",
    "--benchmark-enable",
    "-n",
    "0",
    "--bench-device",
    "cuda",
    "--bench-size-mib",
    "1024",
    "--bench-sweep-mib",
    "1024",
    "--bench-rounds",
    "2",
    *COMMON,
)
LEASE_STAGES: tuple[Stage, ...] = (
    Stage("impl-suite-lease", 240, "impl", ("-n", "auto", *COMMON), without_gpu="collect", s3=True),
    Stage(
        "bench-lease",
        170,
        "impl",
        BENCH_LEASE_ARGS,
        BENCH_RELEASES,
        without_gpu="collect",
        record="benchmark",
        releases_optional=True,
    ),
    *(
        _gpu_stage(f"{name}-lease", 120, target, release, together=True)
        for name, target, release in (
            ("impl", "impl", None),
            *((release, spec.target, release) for release, spec in RELEASES.items()),
            *((t, t, None) for t in DCP_TARGETS),
        )
    ),
    # The snapshot family with CUDA tensors on impl's overlapped staging (P-SNAP-1 and P-SNAP-2 are expected to fail
    # there: the copy ends at wait_for_staging, not at the return; docs/impl.md).
    _gpu_stage("impl-overlapped-lease", 120, "impl", together=True, env=OVERLAPPED),
)
STAGES: tuple[Stage, ...] = (
    _gpu_stage("impl-gpu", 120, "impl"),
    *(_gpu_stage(f"{name}-gpu", GPU_BUDGET_S.get(r.target, 60), r.target, name) for name, r in RELEASES.items()),
    *(_gpu_stage(f"{target}-gpu", 30, target) for target in DCP_TARGETS),
    _bench_d2h("bench-d2h", 200, "64,256,1024,4096,8192", 5),
    _bench_save("bench-save", 240, 1024, 3, 5),
    # The whole suite on impl; test_d2h.py is bench-d2h's (its NVRx and Megatron-Core peers need their releases).
    Stage(
        "impl-full",
        480,
        "impl",
        (
            "ckptspec/spec",
            "ckptspec/faults",
            "ckptspec/bench",
            "--ignore",
            "ckptspec/bench/test_d2h.py",
            "-n",
            "auto",
            *COMMON,
        ),
        without_gpu="collect",
        s3=True,
    ),
    *(_full_stage(release) for release in RELEASES),
    *LEASE_STAGES,
    *SWEEP_STAGES,
)
BY_NAME = {stage.name: stage for stage in STAGES}

# Device calls, each within CALL_LIMIT_S with SETUP_S for its set-up.
CALLS: tuple[tuple[str, ...], ...] = (
    tuple(stage.name for stage in STAGES if stage.name.endswith("-gpu")),
    ("bench-d2h", "bench-save"),
    ("impl-full",),
    *((f"{release}-full",) for release in RELEASES),
    tuple(stage.name for stage in LEASE_STAGES),
    tuple(stage.name for stage in SWEEP_STAGES),
)
LEASE_CALL = 8  # the whole GPU half that fits a 15-minute lease: one call, started at once
SWEEP_CALL = 9  # the GPU sweeps, sized for a 15-minute lease of their own: the call to run first when one is lent
LEASE_SIZED = (LEASE_CALL, SWEEP_CALL)  # calls whose deadline is LEASE_DEADLINE_S, not CALL_LIMIT_S


def call_stages(number: int) -> list[Stage]:
    """The stages of call `number` (1-based), in order."""
    if not 1 <= number <= len(CALLS):
        raise ValueError(f"call {number}: the calls are 1 to {len(CALLS)}")
    return [BY_NAME[name] for name in CALLS[number - 1]]


def batches(stages: list[Stage]) -> list[list[Stage]]:
    """The stages in order, consecutive `together` stages in one batch, every other stage alone."""
    grouped: list[list[Stage]] = []
    for stage in stages:
        if stage.together and grouped and grouped[-1][-1].together:
            grouped[-1].append(stage)
        else:
            grouped.append([stage])
    return grouped


def call_seconds(stages: list[Stage]) -> int:
    """The longest a run of these stages takes: the set-up, then each batch as long as its longest budget."""
    return SETUP_S + sum(max(stage.budget_s for stage in batch) for batch in batches(stages))


def call_groups(stages: list[Stage]) -> list[str]:
    """The wheelhouse groups a run of these stages needs, in a stable order."""
    return list(dict.fromkeys(group for stage in stages for group in stage.groups))


def project_requirements() -> dict[str, list[str]]:
    """pyproject.toml's dependencies and test extra, split into the `base` and `s3` groups, less MACHINE_PROVIDES."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    groups: dict[str, list[str]] = {"base": [], "s3": []}
    for requirement in project["dependencies"] + project["optional-dependencies"]["test"]:
        name = distribution_name(requirement)
        if name in MACHINE_PROVIDES:
            continue
        groups["s3" if name in S3_DISTRIBUTIONS else "base"].append(requirement)
    return groups


def distribution_name(requirement: str) -> str:
    """The normalized distribution name of a requirement or wheel file name ("Typing_Extensions>=4" -> "typing-extensions")."""
    name = requirement
    for stop in "<>=!~[;( ":
        name = name.split(stop, 1)[0]
    return name.strip().lower().replace("_", "-").replace(".", "-")
