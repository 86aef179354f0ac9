"""A benchmark run's figures and how they print: the `BenchmarkRun` index and the Markdown formatting helpers.

Shared by the summary's sections and goals (ckptspec.bench.summary).
"""

from __future__ import annotations

__all__ = [
    "BenchmarkRun",
    "GiB",
    "MiB",
    "floor_of",
    "fmt_bytes",
    "fmt_rate",
    "fmt_ratio",
    "fmt_time",
    "md_table",
    "quotient",
    "seconds_of",
    "snapshot_verdict",
]

GiB = 1 << 30
MiB = 1 << 20


class BenchmarkRun:
    """The benchmarks of one run, indexed by figure."""

    def __init__(self, output_json: dict):
        self.json = output_json
        self.info = output_json.get("machine_info", {}).get("ckptspec", {})
        self.rows: dict[str, list[dict]] = {}
        for b in output_json.get("benchmarks", []):
            extra = b.get("extra_info", {})
            if "figure" in extra:
                # A ceiling is what the machine allows at best: its fastest round. Figures: the median.
                stat = "min" if extra["figure"] == "ceiling" else "median"
                row = dict(extra, seconds=b["stats"][stat], rounds=b["stats"]["rounds"], name=b["name"])
                self.rows.setdefault(extra["figure"], []).append(row)

    def get(self, figure: str, peer: str | None = None, **match) -> list[dict]:
        return [
            r
            for r in self.rows.get(figure, [])
            if (peer is None or r["peer"] == peer) and all(r.get(k) == v for k, v in match.items())
        ]

    def one(self, figure: str, peer: str, **match) -> dict | None:
        found = self.get(figure, peer, **match)
        return found[0] if found else None

    def ceiling_seconds(self, name: str, nbytes: int) -> float | None:
        """Time the ceiling `name` takes for `nbytes` (nearest measured size, scaled linearly)."""
        rows = self.get("ceiling", name)
        if not rows:
            return None
        row = min(rows, key=lambda r: abs(r["bytes"] - nbytes))
        return row["seconds"] * nbytes / row["bytes"]

    @property
    def label(self) -> str:
        cores = self.info.get("cores", "?")
        where = f"GPU ({self.info['gpu']}), {cores} cores" if self.info.get("gpu") else f"CPU, {cores} cores"
        size = self.info.get("size_mib")
        details = [f"state dict {size:g} MiB"] if size else []
        if self.info.get("threads"):
            details.append(f"{self.info['threads']} trainer thread(s)")
        date = self.json.get("datetime", "")[:10]
        versions = [f"torch {self.info.get('torch', '?')}"] + [
            f"{_PEER_NAMES.get(dist, dist)} {version}"
            for dist, version in sorted(self.info.get("versions", {}).items())
            if version
        ]
        return f"{', '.join([where, *details])} ({date}, {', '.join(versions)})"


# How the label names the peers' distributions (their versions as the run imported them).
_PEER_NAMES = {"megatron-core": "Megatron-Core", "nvidia-resiliency-ext": "NVRx"}


# ---------------------------------------------------------------------------------- formatting


def seconds_of(row: dict | None) -> float | None:
    return row["seconds"] if row else None


def quotient(row: dict | None, reference: dict | None) -> float | None:
    return row["seconds"] / reference["seconds"] if row and reference else None


def fmt_time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def fmt_ratio(value: float | None, reference: float | None) -> str:
    return "-" if value is None or not reference else f"{value / reference:.2f}x"


def fmt_rate(nbytes: int, seconds: float) -> str:
    return f"{nbytes / seconds / 1e9:.2f} GB/s" if seconds else "-"


def fmt_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(n)
    return f"{sign}{n / GiB:.2f} GiB" if n >= GiB else f"{sign}{n / MiB:.1f} MiB"


def md_table(header: list[str], rows: list[list[str]]) -> list[str]:
    if not rows:
        return []
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return lines + ["| " + " | ".join(row) + " |" for row in rows]


def floor_of(run: BenchmarkRun, nbytes: int, device: str) -> tuple[str, float | None]:
    name = "d2h-pinned" if device == "cuda" else "memcpy"
    return name, run.ceiling_seconds(name, nbytes)


def snapshot_verdict(record: dict) -> str:
    """The snapshot check of a stall benchmark, with the device of the tensors it judged: a wrong snapshot of CPU
    tensors says nothing of CUDA tensors, which the peers' documents promise to stage."""
    snapshot = record.get("snapshot")
    if snapshot is None:
        return "-"
    word = "correct" if snapshot == "correct" else "wrong snapshot"
    return f"{word} ({record.get('device', 'cpu').upper()} tensors)"
