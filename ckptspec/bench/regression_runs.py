"""Hand-written regression runs for the regression pass's tests: a pytest-benchmark JSON of the regression set,
a baseline made from runs, and the one-line errors of an unusable input."""

from __future__ import annotations

from pathlib import Path

from ckptspec.bench.regression import __main__ as cli
from ckptspec.bench.regression.baseline import best_of
from ckptspec.bench.regression.measure import Settings

__all__ = ["TIMES", "make_run", "unusable", "write_baseline", "written"]

TIMES = {  # benchmark -> (figure, peer, fastest round in s); extra_info as the benchmarks record it
    "test_memcpy": ("ceiling", "memcpy", 0.001),
    "test_write_fsync": ("ceiling", "write-fsync", 0.008),
    "test_stall[dcp:impl]": ("stall", "dcp:impl", 0.008),
    "test_time_to_durable[dcp:impl]": ("durable", "dcp:impl", 0.040),
    "test_load[dcp:impl]": ("load", "dcp:impl", 0.024),
    "test_write[dcp:impl@durable]": ("write", "dcp:impl", 0.016),
    "test_goodput_regression[none]": ("goodput-regression", "none", 0.200),
    "test_goodput_regression[dcp:impl]": ("goodput-regression", "dcp:impl", 0.260),
}


def make_run(factor: float = 1.0, commit: str = "c0ffee", **times: float) -> dict:
    """A pytest-benchmark JSON of the regression set: TIMES x factor, single benchmarks overridden by
    `times` (keyword: the benchmark name with [..] as _..., e.g. test_stall_dcp_impl_)."""
    benches = []
    for name, (figure, peer, seconds) in TIMES.items():
        seconds = times.get(_key(name), seconds * factor)
        extra = {"figure": figure, "peer": peer, "bytes": 8 << 20}
        if figure == "write":
            extra.update(dest="durable", ceiling="write-fsync")
        benches.append({"name": name, "stats": {"min": seconds, "median": seconds * 1.1}, "extra_info": extra})
    return {
        "machine_info": {
            "system": "Linux",
            "machine": "x86_64",
            "node": "ci",
            "python_implementation": "CPython",
            "python_version": "3.12.1",
            "cpu": {"brand_raw": "Test CPU"},
            "ckptspec": {"cores": 2, "torch": "2.13.0"},
        },
        "commit_info": {"id": commit, "dirty": False},
        "datetime": "2026-11-25T12:00:00",
        "benchmarks": benches,
    }


def _key(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def written(path: Path, content: str | None) -> Path:
    """`path`, holding `content` (None: left missing)."""
    if content is not None:
        path.write_text(content)
    return path


def unusable(capsys, argv: list[str]) -> str:
    """The command's stderr, asserted to be one line with exit status 2."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def write_baseline(path: Path, *runs: dict) -> Path:
    best_of(list(runs) or [make_run()], Settings()).write(path)
    return path
