"""impl's phase marks (ckptspec/impl/phases.py): with CKPTSPEC_IMPL_PHASES naming a file, one save through the
NVRx recipe leaves each mark of the module's docstring, from the trainer and the worker, in the order a save
makes them. The benchmarks read them to show where impl's time goes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_SAVE = textwrap.dedent(
    """
    import sys, torch
    from ckptspec.spec.harness import load_target
    from ckptspec.spec.harness.surface.saver_api import protocol_saver

    def main():
        saver = protocol_saver(load_target("impl"), persistent=True)
        state = {"model": {"w": torch.randn(1000), "b": torch.randn(10)}, "step": 1}
        for k in range(int(sys.argv[2])):
            handle = saver.start(state, f"{sys.argv[1]}-{k}")
            handle.staged()
            handle.wait()
        saver.close()

    if __name__ == "__main__":
        main()
    """
)
_BOUND_S = 120
PLAN_CACHE_ENV = "CKPTSPEC_IMPL_PLAN_CACHE"  # the impl target's plan cache (ckptspec/spec/targets/impl.py)
_ORDER = (
    ("plan", "planned"),
    ("planned", "copies"),
    ("copies", "snapshot"),
    ("first byte", "last byte"),
    ("last byte", "durable"),
    ("durable", "finalize"),
    ("finalize", "committed"),
    ("committed", "finalized"),
)


# A repeated save that reuses its plan (the target's plan cache on) marks its planning's steps.
_PREPARED_ORDER = ("plan", "fingerprinted", "buckets", "agreed", "planned")


def _save(tmp_path, marks: str | None, saves: int = 1, plan_cache: bool = False) -> None:
    script = tmp_path / "save.py"
    script.write_text(_SAVE)
    env = {k: v for k, v in os.environ.items() if k not in ("CKPTSPEC_IMPL_PHASES", PLAN_CACHE_ENV)}
    if marks is not None:
        env["CKPTSPEC_IMPL_PHASES"] = marks
    env[PLAN_CACHE_ENV] = "1" if plan_cache else "0"
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt"), str(saves)],
        env=env,
        capture_output=True,
        timeout=_BOUND_S,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]


def test_a_save_leaves_every_mark_in_order(tmp_path):
    marks = tmp_path / "marks.tsv"
    _save(tmp_path, str(marks))
    rows = [line.split("\t") for line in marks.read_text().splitlines()]
    first: dict[str, tuple[float, int]] = {}
    for name, at, pid in rows:
        first.setdefault(name, (float(at), int(pid)))
    expected = {"plan", "planned", "handed over", "copies", "snapshot", "first byte", "last byte", "durable"}
    expected |= {"finalize", "committed", "finalized"}
    assert set(first) == expected, f"marks made: {sorted(first)}"
    assert first["first byte"][1] != first["plan"][1], "the writer's marks should come from the worker's process"
    for before, after in _ORDER:
        assert first[before][0] <= first[after][0], f"{before!r} came after {after!r}: {rows}"


def test_a_repeated_save_marks_its_planning_steps(tmp_path):
    """The second save with the plan cache on reuses the first's plan: its planning marks, and only its, show the
    fingerprint, the buckets and the agreement between ranks, in that order (the goals' planning split reads them)."""
    marks = tmp_path / "marks.tsv"
    _save(tmp_path, str(marks), saves=2, plan_cache=True)
    names = [line.split("\t")[0] for line in marks.read_text().splitlines()]
    plans = [i for i, name in enumerate(names) if name == "plan"]
    assert len(plans) == 2, f"marks made: {names}"
    first, second = names[plans[0] : plans[1]], names[plans[1] :]
    assert not set(_PREPARED_ORDER[1:-1]) & set(first), f"the first save planned in full: {first}"
    steps = [name for name in second if name in _PREPARED_ORDER]
    assert steps == list(_PREPARED_ORDER), f"the repeated save's planning marks: {steps}"
