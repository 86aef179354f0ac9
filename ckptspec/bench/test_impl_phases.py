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
        handle = saver.start({"model": {"w": torch.randn(1000), "b": torch.randn(10)}, "step": 1}, sys.argv[1])
        handle.staged()
        handle.wait()
        saver.close()

    if __name__ == "__main__":
        main()
    """
)
_BOUND_S = 120
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


def _save(tmp_path, marks: str | None) -> None:
    script = tmp_path / "save.py"
    script.write_text(_SAVE)
    env = {k: v for k, v in os.environ.items() if k != "CKPTSPEC_IMPL_PHASES"}
    if marks is not None:
        env["CKPTSPEC_IMPL_PHASES"] = marks
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt")], env=env, capture_output=True, timeout=_BOUND_S
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
