"""The summary's arithmetic and README update, on a hand-written run (not a benchmark)."""

from __future__ import annotations

from ckptspec.bench import summary
from ckptspec.bench.goals import goals as goals_of

MiB = 1 << 20


def _bench(figure, peer, median, nbytes=8 * MiB, fastest=None, **extra):
    stats = {"median": median, "min": median if fastest is None else fastest, "rounds": 5}
    return {
        "name": f"{figure}[{peer}]",
        "stats": stats,
        "extra_info": {"figure": figure, "peer": peer, "bytes": nbytes, "device": "cpu", **extra},
    }


RUN = {
    "datetime": "2026-01-02T03:04:05",
    "machine_info": {"ckptspec": {"cores": 2, "gpu": None, "torch": "2.13.0", "size_mib": 8, "threads": 1}},
    "benchmarks": [
        _bench("ceiling", "memcpy", 0.003, nbytes=16 * MiB, fastest=0.001),  # fastest round, scaled: 0.5 ms
        _bench("ceiling", "write-fsync", 0.010),
        _bench("stall", "dcp:impl", 0.0006, family="dcp", snapshot="correct", phases={"plan": 0.0001}),
        _bench("stall", "dcp:nvrx", 0.0003, family="dcp", snapshot="wrong"),
        _bench("durable", "dcp:impl", 0.011, family="dcp", durable=True),
        _bench("durable", "dcp:save", 0.010, family="dcp", durable=True),
        _bench("write", "dcp:impl", 0.020, dest="durable", ceiling="write-fsync"),
        _bench(
            "memory",
            "dcp:impl",
            1.0,
            memory={
                "staged_bytes": 8 * MiB,
                "saves": 20,
                "runtime_bytes": 0,
                "peak_extra_bytes": 8 * MiB,
                "retained_bytes": 8 * MiB,
                "growth_bytes": 0,
                "shm_peak_bytes": 8 * MiB,
                "pinned_peak_bytes": 0,
                "worker_gpu_bytes": None,
            },
        ),
    ],
}


def test_ratios_use_the_fastest_ceiling_round_scaled_to_the_same_bytes():
    text = summary.render(RUN)
    assert "| `dcp:impl` | 0.6 ms | 76.8 | 1.20x memcpy | 2.00x |" in text
    assert "| `dcp:impl` | 11 ms | 1.10x | 1.10x |" in text  # to committed vs write+fsync, vs dcp.save
    assert "| `dcp:impl` | durable | 0.42 GB/s | 0.50x write-fsync | 1.00x |" in text


def test_goals_are_checked_against_the_figures():
    goals = "\n".join(goals_of(summary.BenchmarkRun(RUN)))
    assert "- [ ] `dcp:impl` stall <= 1.05x the memcpy floor, snapshot correct: 1.20x" in goals  # missed, by how much
    assert "- [ ] `dcp:impl` stall no worse than `dcp:nvrx`" in goals
    assert "- [ ] `dcp:impl` time to durable <= 1.05x synchronous `dcp.save`: 1.10x" in goals  # missed, by how much
    assert "- [ ] `dcp:impl-overlapped`: not measured in this run" in goals
    assert "- [x] `dcp:impl` peak extra host memory <= 1.1x staged bytes: 1.00x" in goals
    assert "`dcp:impl` ahead of `dcp:async_save-thread` on stall: not measured in this run" in goals


def test_overlapped_goals_divide_the_return_and_the_stall_by_the_floor():
    overlapped = _bench(
        "stall",
        "dcp:impl-overlapped",
        0.0004,
        family="dcp",
        snapshot="correct",
        phases={"plan": 0.00001, "schedule": 0.00001, "staging wait": 0.00038},
    )
    run = {**RUN, "benchmarks": [*RUN["benchmarks"], overlapped]}
    goals = "\n".join(goals_of(summary.BenchmarkRun(run)))
    assert "- [x] `dcp:impl-overlapped` returns within 0.05x the memcpy floor: 0.04x" in goals
    assert "- [x] `dcp:impl-overlapped` stall until the state may change <= 1.0x the memcpy floor" in goals
    assert "(a GPU goal; this run's CPU figure): 0.80x, correct (CPU tensors)" in goals


def test_on_a_gpu_the_device_clone_peer_has_goals_of_its_own():
    """The clone peer's stall ends at the clone on the device, not at the device-to-host copy: judged on its own."""
    clone = _bench(
        "stall",
        "dcp:impl-overlapped-clone",
        0.0002,
        family="dcp",
        snapshot="correct",
        phases={"plan": 0.00001, "schedule": 0.00001, "staging wait": 0.00018},
    )
    run = {**RUN, "benchmarks": [*RUN["benchmarks"], clone]}
    machine = {"cores": 2, "gpu": "GPU X", "torch": "2.13.0", "size_mib": 8, "threads": 1}
    gpu_run = {**run, "machine_info": {"ckptspec": machine}}
    assert "dcp:impl-overlapped-clone" not in "\n".join(goals_of(summary.BenchmarkRun(run)))  # a CPU run: no clone line
    goals = "\n".join(goals_of(summary.BenchmarkRun(gpu_run)))
    assert "- [x] `dcp:impl-overlapped-clone` stall until the state may change <= 1.0x the memcpy floor" in goals
    assert "- [ ] `dcp:impl-overlapped`: not measured in this run" in goals


def test_update_replaces_only_the_marked_block(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{summary.START}\nold\n{summary.END}\nafter\n")
    summary.update(readme, summary.render_compact(RUN))
    text = readme.read_text()
    assert text.startswith("before\n")
    assert text.endswith(f"{summary.END}\nafter\n")
    assert "old" not in text
    assert "#### CPU, 2 cores, state dict 8 MiB, 1 trainer thread(s) (2026-01-02, torch 2.13.0)" in text


def test_noise_suggests_a_threshold_above_the_worst_spread():
    runs = [
        {"benchmarks": [{"name": "a", "stats": {"min": m}}, {"name": "b", "stats": {"min": 1.0}}]}
        for m in (0.010, 0.030, 0.020)
    ]
    text, threshold = summary.noise(runs)
    assert "| `a` | 10 ms / 30 ms / 20 ms | 3.00x |" in text
    assert threshold == 350  # 3.00 x 1.5 = 4.5, i.e. 350% slower


def test_the_heading_names_the_peer_versions_the_run_imported():
    base: dict = RUN
    info = {**base["machine_info"]["ckptspec"], "versions": {"nvidia-resiliency-ext": "0.7.0", "megatron-core": None}}
    run = {**RUN, "machine_info": {"ckptspec": info}}
    heading = summary.render_compact(run).splitlines()[0]
    assert heading.endswith("(2026-01-02, torch 2.13.0, NVRx 0.7.0)")


def test_a_snapshot_verdict_names_the_device_of_the_tensors_it_judged():
    """Issue 30: a wrong snapshot of CPU tensors is not reported as a wrong snapshot of the GPU tensors users save."""
    assert summary.snapshot_verdict({"snapshot": "wrong"}) == "wrong snapshot (CPU tensors)"
    assert summary.snapshot_verdict({"snapshot": "INCORRECT", "device": "cuda"}) == "wrong snapshot (CUDA tensors)"
    assert summary.snapshot_verdict({"snapshot": "correct"}) == "correct (CPU tensors)"
    assert summary.snapshot_verdict({}) == "-"


def test_a_staged_peer_timed_to_its_return_only_says_so():
    """A staging peer's stall is comparable only when it includes the wait for staging (phase "staging wait")."""
    old = {"peer": "dcp:async_save-staged", "phases": {"call": 0.01}}
    assert summary.stall_peer(old) == "`dcp:async_save-staged` (call return only)"
    assert summary.stall_peer({**old, "phases": {"staging wait": 0.2}}) == "`dcp:async_save-staged`"
    assert summary.stall_peer({"peer": "dcp:impl", "phases": {}}) == "`dcp:impl`"
