"""The release list: every target release this project judges and records, in one place.

Every tool that needs the matrix imports it from here: noxfile.py (one `spec(NAME)` and one `record(NAME)` session
per release), gpu_run (which releases a GPU run installs), regenerate.py (which stored runs make which table and
page), `ckptspec judge` (whether the installed version has a recorded run and expectations), and
harness_tests/test_releases.py checks pyproject.toml's extras against it. Standard library only: gpu_run imports it
on a GPU machine before anything is installed, and `ckptspec report` without torch.

A release's NAME is `<target>-<version>`: its stored run is `conformance/all/<NAME>.json`, its nox sessions
`spec(<NAME>)` and `record(<NAME>)`. For torch's DCP the target is one configuration of `dcp.async_save`
(dcp-thread, dcp-process, dcp-staged) and the version is torch's, so judging a new torch is one entry per
configuration (`_dcp("2.15.0", "3.12")`).

Adding a release: one entry below, then `nox -s "record(<NAME>)"` (CONTRIBUTING.md, "Adding a release"), which
runs its suites in a virtual environment of its own, writes conformance/all/<NAME>.json and regenerates the pages.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "ALL_AREAS",
    "LOCAL_REFERENCE",
    "NVRX_AREAS",
    "PROTOCOL_AREAS",
    "REFERENCE",
    "RELEASES",
    "SUITES",
    "TORCH",
    "Release",
    "base_version",
    "benchmark_peers",
    "by_name",
    "find",
    "full_suite",
    "manager_only",
    "newest",
    "protocol_only",
    "with_manager",
]

TORCH = "2.13.0"  # the torch a library release is judged with (the README's pin, inside pyproject's torch>= range)
SUITES = ("ckptspec/spec", "ckptspec/faults")  # what a recorded run runs, for every release (capabilities gate tests)
# The clause areas (ckptspec/spec/clauses/*.toml); `faults` is judged by the fault suite, ckptspec/faults/.
ALL_AREAS = ("async_ckpt", "storage", "local", "integrity", "protocol", "faults", "manager")
PROTOCOL_AREAS = ("protocol", "faults")  # the areas of a target written against the adapter contract only
# The areas whose tests use NVRx's module paths (an adapter's MODULES); a target that maps none skips them.
NVRX_AREAS = tuple(area for area in ALL_AREAS if area not in (*PROTOCOL_AREAS, "manager"))
REFERENCE = "impl"  # the reference implementation's stored run, conformance/all/impl.json (not a release)
LOCAL_REFERENCE = "impl-local"  # impl's LocalCheckpointManager judged as a manager (the manager area only)


@dataclass(frozen=True)
class Release:
    """One judged release of a target.

    `needs`: what its checkpointing modules import beyond torch, numpy and this project's dependencies (installed
    beside its wheel where that wheel is installed without dependencies: on a GPU machine, and NVRx 0.7.0 in nox;
    and in nox beside a release whose wheel does not declare them: torchtitan 0.2.2's triton).
    `wheel_only`: pip options that fetch its wheel for another platform tag, where pip refuses it on this machine
    (NVRx 0.7.0's manylinux_2_39 wheel on glibc 2.36): installed without dependencies, then `needs`.
    `gpu`: whether the GPU run (gpu_run) judges it: a library release from its wheel, a DCP configuration on the
    GPU machine's own torch.
    `benchmark_peer`: the release the benchmarks' peer of its library runs (one per library, its newest): its CPU
    benchmark run is stored as ckptspec/bench/results/cpu-NAME.json, and the GPU run's benchmark stages put its wheel on
    the path.
    `unjudged`: a configuration of the library that users run and the stored run does not speak for, and why (its
    findings page says so at the top); empty where the run covers what the library offers.
    """

    target: str  # the adapter (--impl)
    version: str  # the release judged; for DCP, torch's version
    python: str  # the Python its nox sessions use
    distribution: str  # the pip distribution whose installed version is the run's version
    areas: tuple[str, ...]  # the clause areas whose tables judge it
    gpu: bool
    needs: tuple[str, ...] = ()
    wheel_only: tuple[str, ...] = ()
    benchmark_peer: bool = False
    unjudged: str = ""

    @property
    def name(self) -> str:
        return f"{self.target}-{self.version}"

    @property
    def requirement(self) -> str:
        return f"{self.distribution}=={self.version}"

    @property
    def torch(self) -> str:
        """The torch version its environment holds: its own for DCP, else TORCH."""
        return self.version if self.distribution == "torch" else TORCH

    @property
    def stored_run(self) -> str:
        """Its stored run, relative to the repository root."""
        return f"conformance/all/{self.name}.json"


_FULL = tuple(area for area in ALL_AREAS if area != "manager")  # Megatron-Core's async queue ships no manager
_FULL_AND_MANAGER = ALL_AREAS  # NVRx: its LocalCheckpointManager is judged as a manager too
_WITH_MANAGER = (*PROTOCOL_AREAS, "manager")  # the libraries whose checkpoint manager is judged too
_MANAGER_ONLY = ("manager",)  # a checkpoint manager without a save of its own to judge (the transformers Trainer)
_NVRX_070_WHEEL = ("--only-binary=:all:", "--python-version", "3.12", "--platform", "manylinux_2_39_x86_64")


_TITAN_PINNED = (
    'async_mode="async_with_pinned_mem", the mode a GPU user runs (pinned, non-blocking staging through '
    'torch\'s DefaultStager, then a checkpoint process): judged is async_mode="async" only, since the pinned '
    "mode refuses to run without an accelerator; none of these verdicts speaks for it"
)


def _dcp(torch: str, python: str) -> list[Release]:
    """The three configurations of `dcp.async_save` on one torch release."""
    return [
        Release(t, torch, python, "torch", PROTOCOL_AREAS, True) for t in ("dcp-thread", "dcp-process", "dcp-staged")
    ]


RELEASES: tuple[Release, ...] = (
    # NVRx 0.4.1 gets its declared dependencies (all small) on a GPU machine; 0.7.0 only what its checkpointing
    # package imports. Megatron-Core declares only torch, numpy and packaging.
    Release(
        "nvrx",
        "0.4.1",
        "3.11",
        "nvidia-resiliency-ext",
        _FULL_AND_MANAGER,
        True,
        ("defusedxml", "nvidia-ml-py>=12.570.86", "packaging", "psutil>=6.0.0", "pynvml>=12.0.0", "pyyaml"),
    ),
    Release(
        "nvrx",
        "0.7.0",
        "3.12",
        "nvidia-resiliency-ext",
        _FULL_AND_MANAGER,
        True,
        ("psutil", "packaging", "pyyaml"),
        _NVRX_070_WHEEL,
        benchmark_peer=True,
    ),
    Release("mcore", "0.16.1", "3.11", "megatron-core", _FULL, True, ("packaging>=24.2",)),
    Release("mcore", "0.19.2", "3.12", "megatron-core", _FULL, True, ("packaging>=24.2",), benchmark_peer=True),
    *_dcp(TORCH, "3.11"),
    *_dcp("2.15.0", "3.11"),  # PyPI has only its CUDA wheel (about 3 GB with its dependencies); it runs on a CPU too
    # Protocol-layer targets, written against the adapter contract only. Lightning 2.5.3: the last release before
    # the clone of #21079. torchtitan's async_mode "async" ("async_with_pinned_mem" needs an accelerator). Their
    # wheels and dependencies are not in the set a GPU stage installs yet.
    Release("torchtitan", "0.3.0", "3.11", "torchtitan", _WITH_MANAGER, False, unjudged=_TITAN_PINNED),
    # 0.2.2: its manager at torchtitan/components/checkpoint.py (0.3.0 moved it to components/checkpointer/dcp.py);
    # `import torchtitan` imports triton (components/quantization -> models/moe/kernels.py:8), which its wheel does
    # not declare (torch's CUDA wheels bring it): a CPU-only environment installs it beside (`needs`).
    Release("torchtitan", "0.2.2", "3.11", "torchtitan", _WITH_MANAGER, False, ("triton",), unjudged=_TITAN_PINNED),
    Release("lightning", "2.6.6", "3.11", "pytorch-lightning", _WITH_MANAGER, False),
    Release("lightning", "2.5.3", "3.11", "pytorch-lightning", _WITH_MANAGER, False),
    # Issue 63's libraries, each as a user runs it by default and, where that is another target, in the
    # asynchronous configuration its documents recommend (a target per configuration, as for DCP). CPU runs only.
    # DeepSpeed 0.18.3: the release before the decoupled engine's hang fix (PR 7742, issue 7741).
    Release(
        "deepspeed",
        "0.18.3",
        "3.11",
        "deepspeed",
        _WITH_MANAGER,
        False,
        unjudged=(
            'the decoupled checkpoint engine (`{"checkpoint": {"writer": {"decoupled": true}}}`, DeepSpeed\'s '
            "asynchronous save): in 0.18.3 it cannot be built: DecoupledCheckpointEngine.__init__ calls "
            "`mp.get_start_methods(allow_None=False)` (runtime/checkpoint_engine/decoupled_checkpoint_engine.py:71), "
            "a function torch.multiprocessing does not have, so `deepspeed.initialize` raises AttributeError for "
            "every config that asks for it (engine.py:1181-1186, _configure_checkpointing); 0.19.8 replaced the call "
            "(PR 7742). None of these verdicts speaks for it"
        ),
    ),
    Release(
        "deepspeed",
        "0.19.8",
        "3.11",
        "deepspeed",
        _WITH_MANAGER,
        False,
    ),
    # The decoupled engine, DeepSpeed's documented asynchronous save, as a target of its own (as DCP's are).
    Release("deepspeed-decoupled", "0.19.8", "3.11", "deepspeed", _WITH_MANAGER, False),
    Release("olmo-core", "3.0.0", "3.11", "ai2-olmo-core", PROTOCOL_AREAS, False),
    Release("olmo-core", "2.6.0", "3.11", "ai2-olmo-core", PROTOCOL_AREAS, False),  # the last 2.x
    Release("transformers", "5.23.0", "3.11", "transformers", _MANAGER_ONLY, False),
    # The default configuration (O_DIRECT storage): every save fails on ext4, its P-DEFAULT-1 break; the other
    # protocol clauses read "not judged" there (entries `blocked`) and are judged on the buffered configuration.
    Release("torch-checkpointing", "0.1.1", "3.11", "torch-checkpointing", PROTOCOL_AREAS, False),
    Release("torch-checkpointing-buffered", "0.1.1", "3.11", "torch-checkpointing", PROTOCOL_AREAS, False),
)


def by_name() -> dict[str, Release]:
    return {release.name: release for release in RELEASES}


def full_suite() -> list[Release]:
    """The releases judged on the NVRx-shaped areas too (the conformance table's columns after impl)."""
    return [r for r in RELEASES if "async_ckpt" in r.areas]


def protocol_only() -> list[Release]:
    """The releases judged through the adapter contract only on the protocol area (protocol, faults, and a manager
    where they ship one)."""
    return [r for r in RELEASES if "async_ckpt" not in r.areas and "protocol" in r.areas]


def manager_only() -> list[Release]:
    """The releases judged on the manager area alone (a manager whose saves are not judged as saves)."""
    return [r for r in RELEASES if r.areas == _MANAGER_ONLY]


def with_manager() -> list[Release]:
    """The releases whose checkpoint manager is judged (the manager table's columns after impl)."""
    return [r for r in RELEASES if "manager" in r.areas]


def benchmark_peers() -> list[Release]:
    """The releases the benchmarks' library peers run (`benchmark_peer`)."""
    return [r for r in RELEASES if r.benchmark_peer]


def newest(areas: tuple[str, ...] = ALL_AREAS) -> list[Release]:
    """The newest release of each target judged on any of `areas`, in the list's order: the columns a new target's
    run is shown beside (`ci_job summary --stored`)."""
    chosen: dict[str, Release] = {}
    for release in RELEASES:
        if set(release.areas) & set(areas):
            current = chosen.get(release.target)
            if current is None or _version_key(release.version) > _version_key(current.version):
                chosen[release.target] = release
    return list(chosen.values())


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in base_version(version).split("."))


def base_version(version: str) -> str:
    """A version without its local label: torch's "2.13.0+cpu" is release 2.13.0."""
    return version.split("+", 1)[0]


def find(target: str, version: str) -> Release | None:
    """The listed release of `target` at an installed `version`, or None (no recorded run of it)."""
    return by_name().get(f"{target}-{base_version(version)}")
