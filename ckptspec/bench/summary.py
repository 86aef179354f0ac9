"""Markdown summary of benchmark runs: each figure against its ceiling and the best peer.

    python -m ckptspec.bench.summary RUN.json [RUN.json ...]                 # full summary on stdout
    python -m ckptspec.bench.summary RUN.json [RUN.json ...] --update docs/benchmarks.md   # one compact table per run
    python -m ckptspec.bench.summary --noise RUN.json RUN.json ...           # spread of repeated runs

RUN.json is pytest-benchmark's --benchmark-json output of `pytest ckptspec/bench --benchmark-enable`.
Each benchmark's extra_info names its figure (stall, durable, write, ...), its peer and its bytes;
ceilings are benchmarks of figure "ceiling". Times are the median of the rounds; a ceiling is its
fastest round (the best the machine did). A ceiling measured for other bytes is scaled linearly to
the figure's bytes. With --update the compact tables replace what is between the
`<!-- benchmarks:start -->` and `<!-- benchmarks:end -->` markers of the file.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from ckptspec.bench import goodput_summary
from ckptspec.bench.figures import (
    BenchmarkRun,
    GiB,
    floor_of,
    fmt_bytes,
    fmt_rate,
    fmt_ratio,
    fmt_time,
    md_table,
    seconds_of,
    snapshot_verdict,
)
from ckptspec.bench.goals import goals
from ckptspec.report.blocks import update_file
from ckptspec.report.runs import ReportError

__all__ = ["main", "noise", "render", "render_compact"]

START, END = "<!-- benchmarks:start -->", "<!-- benchmarks:end -->"


# ------------------------------------------------------------------------------------ sections


def _ceilings(run: BenchmarkRun) -> list[str]:
    rows = [
        [r["peer"], fmt_bytes(r["bytes"]), fmt_time(r["seconds"]), fmt_rate(r["bytes"], r["seconds"])]
        for r in sorted(run.get("ceiling"), key=lambda r: (r["peer"], r["bytes"]))
    ]
    return md_table(["ceiling", "bytes", "time", "throughput"], rows)


def peer_label(record: dict) -> str:
    """The peer's name, with its `note` (how it was run) where it has one."""
    return f"`{record['peer']}`" + (f" ({record['note']})" if record.get("note") else "")


def stall_peer(record: dict) -> str:
    """The peer's name in a stall table; a staging peer recorded before its staging wait was timed says that its
    figure is the call's return only (not comparable with the others' time until the state may change)."""
    label = peer_label(record)
    if "staged" in record["peer"] and "staging wait" not in record.get("phases", {}):
        label += " (call return only)"
    return label


def _stall(run: BenchmarkRun, figure: str) -> list[str]:
    rows_in = run.get(figure)
    best = min((r["seconds"] for r in rows_in), default=None)
    rows = []
    for r in sorted(rows_in, key=lambda r: r["seconds"]):
        floor_name, floor = floor_of(run, r["bytes"], r.get("device", "cpu"))
        phases = " / ".join(f"{k} {fmt_time(v)}" for k, v in r.get("phases", {}).items())
        row = [
            stall_peer(r),
            fmt_time(r["seconds"]),
            f"{r['seconds'] * 1e3 * GiB / r['bytes']:.1f}",
            f"{fmt_ratio(r['seconds'], floor)} {floor_name}",
            fmt_ratio(r["seconds"], best),
            phases,
        ]
        if figure == "stall":
            row.append(snapshot_verdict(r))
        else:
            row.append(fmt_time(r.get("phases", {}).get("durable")))
        rows.append(row)
    last = "snapshot" if figure == "stall" else "durable after"
    return md_table(["peer", "stall", "ms/GiB", "x floor", "x best", "phases", last], rows)


def _durable(run: BenchmarkRun) -> list[str]:
    rows_in = run.get("durable")
    best = min((r["seconds"] for r in rows_in), default=None)
    rows = []
    for r in sorted(rows_in, key=lambda r: r["seconds"]):
        sync = run.one("durable", f"{r['family']}:save")
        ceiling = run.ceiling_seconds("write-fsync", r["bytes"])
        rows.append(
            [
                peer_label(r),
                fmt_time(r["seconds"]),
                fmt_ratio(r["seconds"], ceiling),
                fmt_ratio(r["seconds"], seconds_of(sync)),
                fmt_ratio(r["seconds"], best),
                "yes" if r.get("durable") else "no (no fsync)",
            ]
        )
    return md_table(["peer", "to committed", "x write+fsync", "x sync save", "x best", "fsync'ed"], rows)


def _write(run: BenchmarkRun) -> list[str]:
    rows = []
    for r in sorted(run.get("write"), key=lambda r: (r["dest"], r["seconds"])):
        same = [o["seconds"] for o in run.get("write", dest=r["dest"])]
        ceiling = run.ceiling_seconds(r["ceiling"], r["bytes"])
        rows.append(
            [
                f"`{r['peer']}`",
                r["dest"],
                fmt_rate(r["bytes"], r["seconds"]),
                f"{fmt_ratio(ceiling, r['seconds'])} {r['ceiling']}",
                fmt_ratio(min(same), r["seconds"]),
            ]
        )
    return md_table(["writer", "destination", "throughput", "of ceiling", "of best"], rows)


def _d2h(run: BenchmarkRun) -> list[str]:
    rows = []
    for r in sorted(run.get("d2h"), key=lambda r: (r["peer"], r["bytes"])):
        ceiling = run.ceiling_seconds("d2h-pinned", r["bytes"])
        rows.append(
            [
                peer_label(r),
                fmt_bytes(r["bytes"]),
                fmt_rate(r["bytes"], r["seconds"]),
                fmt_ratio(ceiling, r["seconds"]),
            ]
        )
    return md_table(["path", "bytes", "throughput", "of pinned copy"], rows)


def _memory(run: BenchmarkRun) -> list[str]:
    rows = []
    for r in sorted(run.get("memory"), key=lambda r: r["peer"]):
        m = r["memory"]
        rows.append(
            [
                f"`{r['peer']}`",
                fmt_bytes(m["staged_bytes"]),
                fmt_bytes(m["peak_extra_bytes"]),
                fmt_ratio(m["peak_extra_bytes"], m["staged_bytes"]),
                fmt_bytes(m["retained_bytes"]),
                f"{fmt_bytes(m['growth_bytes'])} ({m['saves']} saves)",
                fmt_bytes(m["runtime_bytes"]),
                fmt_bytes(m.get("rss_peak_bytes")),
                fmt_bytes(m["shm_peak_bytes"]),
                fmt_bytes(m["pinned_peak_bytes"]),
                fmt_bytes(m["worker_gpu_bytes"]),
            ]
        )
    return md_table(
        [
            "peer",
            "staged",
            "peak extra",
            "x staged",
            "retained",
            "growth",
            "runtime",
            "RSS peak (sum)",
            "shm peak",
            "pinned peak",
            "worker GPU",
        ],
        rows,
    )


def _load(run: BenchmarkRun) -> list[str]:
    rows_in = run.get("load")
    best = min((r["seconds"] for r in rows_in), default=None)
    rows = [
        [f"`{r['peer']}`", fmt_time(r["seconds"]), fmt_rate(r["bytes"], r["seconds"]), fmt_ratio(r["seconds"], best)]
        for r in sorted(rows_in, key=lambda r: r["seconds"])
    ]
    return md_table(["written by", "load", "throughput", "x best"], rows)


# --------------------------------------------------------------------------------------- render


SECTIONS = [
    (
        "Trainer stall, steady state (from the call until the state may change: the call's return, plus the wait for "
        "staging where the peer signals it; floor: same bytes through memcpy, or pinned D2H on GPU)",
        lambda run: _stall(run, "stall"),
    ),
    ("Trainer stall, first save (fresh instance)", lambda run: _stall(run, "stall-first")),
    ("Time to durable and committed (call to metadata visible and finalized)", _durable),
    ("Write throughput (the write alone, data fsync'ed unless the destination says page cache)", _write),
    ("D2H staging throughput", _d2h),
    ("Host memory over consecutive saves (PSS of the peer's process tree)", _memory),
    ("Load", _load),
    ("Ceilings measured in the same run", _ceilings),
]


def _checksum_cost(run: BenchmarkRun) -> list[str]:
    """ckptspec/bench/test_checksums.py: `dcp:impl` with checksums (IN-1) on against off, as ratios."""
    on, off = run.one("checksums", "dcp:impl", checksums=True), run.one("checksums", "dcp:impl", checksums=False)
    if not on or not off:
        return []
    return [
        f"Checksums (IN-1), `dcp:impl` on against off: stall {fmt_ratio(on['seconds'], off['seconds'])} "
        f"({fmt_time(on['seconds'])} vs {fmt_time(off['seconds'])}), to committed "
        f"{fmt_ratio(on['durable_s'], off['durable_s'])} ({fmt_time(on['durable_s'])} vs {fmt_time(off['durable_s'])}).",
        "",
    ]


def render(output_json: dict, heading: str = "###") -> str:
    """The full Markdown summary of one run: goals, then one table per figure, then goodput."""
    run = BenchmarkRun(output_json)
    alone = goodput_summary.alone(run)
    lines = [f"{heading} {run.label}", ""]
    if not alone:
        lines += [f"{heading}# Goals for impl", "", *goals(run), "", *_checksum_cost(run)]
    for title, section in SECTIONS:
        table = section(run)
        if table:
            lines += [f"{heading}# {title}", "", *table, ""]
    lines += goodput_summary.render(run, heading)
    return "\n".join(lines if alone else [*lines, _FOOTNOTE]) + "\n"


def render_compact(output_json: dict, heading: str = "####") -> str:
    """One table per run for docs/benchmarks.md: each peer's main figures, the ceilings, the goals; the goodput table."""
    run = BenchmarkRun(output_json)
    goodput = goodput_summary.render_compact(run)
    if goodput_summary.alone(run):
        return "\n".join([f"{heading} Goodput: {run.label}", "", *goodput]) + "\n"
    return _compact_saves(run, heading) + ("\n" + "\n".join(goodput) if goodput else "")


def _compact_saves(run: BenchmarkRun, heading: str) -> str:
    best_stall = min((r["seconds"] for r in run.get("stall")), default=None)
    rows = []
    for r in sorted(run.get("stall"), key=lambda r: r["seconds"]):
        peer = r["peer"]
        floor_name, floor = floor_of(run, r["bytes"], r.get("device", "cpu"))
        first, durable = run.one("stall-first", peer), run.one("durable", peer)
        sync = durable and run.one("durable", f"{durable['family']}:save")
        memory, load = run.one("memory", peer), run.one("load", peer)
        rows.append(
            [
                stall_peer(r),
                f"{r['seconds'] * 1e3 * GiB / r['bytes']:.1f}",
                f"{fmt_ratio(r['seconds'], floor)} {floor_name}",
                fmt_ratio(r["seconds"], best_stall),
                snapshot_verdict(r),
                fmt_time(seconds_of(first)),
                fmt_time(seconds_of(durable)),
                fmt_ratio(seconds_of(durable), seconds_of(sync)),
                (memory and fmt_ratio(memory["memory"]["peak_extra_bytes"], memory["memory"]["staged_bytes"])) or "-",
                fmt_time(seconds_of(load)),
            ]
        )
    table = md_table(
        [
            "peer",
            "stall ms/GiB",
            "x floor",
            "x best",
            "snapshot",
            "first-save stall",
            "to committed",
            "x sync save",
            "peak extra mem / staged",
            "load",
        ],
        rows,
    )
    ceilings = ", ".join(
        f"{r['peer']} {fmt_rate(r['bytes'], r['seconds'])}"
        for r in sorted(run.get("ceiling"), key=lambda r: (r["peer"], r["bytes"]))
    )
    return (
        "\n".join(
            [
                f"{heading} {run.label}",
                "",
                *table,
                "",
                f"Ceilings: {ceilings or '-'}.",
                "",
                *_checksum_cost(run),
                "Goals for impl:",
                "",
                *goals(run),
                "",
                _FOOTNOTE,
            ]
        )
        + "\n"
    )


_FOOTNOTE = (
    "Times are medians over the rounds, ceilings their fastest round; x ratios divide a time by the "
    "reference time (lower is better), `of ...` columns divide throughputs (1.00x is the reference)."
)


def noise(runs: list[dict], margin: float = 1.5) -> tuple[str, int]:
    """Run-to-run spread of each benchmark's fastest round over repeated runs, and the threshold it suggests
    (worst spread x margin, rounded up to 50%), returned as N% slower; printed as the factor that
    `python -m ckptspec.bench.regression compare --threshold` takes.

    The margin is wide because a handful of runs underestimates the tail of the spread."""
    fastest: dict[str, list[float]] = {}
    for run in runs:
        for b in run.get("benchmarks", []):
            fastest.setdefault(b["name"], []).append(b["stats"]["min"])
    rows, worst = [], 1.0
    for name, values in sorted(fastest.items()):
        spread = max(values) / min(values)
        worst = max(worst, spread)
        rows.append([f"`{name}`", " / ".join(fmt_time(v) for v in values), f"{spread:.2f}x"])
    threshold = 50 * -(-round((worst * margin - 1) * 100) // 50)
    table = md_table(["benchmark", "fastest round per run", "max / min"], rows)
    return "\n".join(
        [*table, "", f"Worst spread {worst:.2f}x; suggested threshold: {1 + threshold / 100:g} (--threshold)"]
    ) + "\n", threshold


def markers(block: str | None) -> tuple[str, str]:
    """The marker lines of the benchmark block `block` (None: the CPU runs' block, `<!-- benchmarks:start -->`)."""
    if block is None:
        return START, END
    return f"<!-- benchmarks-{block}:start -->", f"<!-- benchmarks-{block}:end -->"


def update(path: Path, text: str, block: str | None = None) -> None:
    """Replace the text between the markers of the benchmark block `block` of `path`."""
    try:
        update_file(path, text, *markers(block))
    except ReportError as exc:
        raise SystemExit(str(exc)) from None


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="pytest-benchmark JSON files")
    parser.add_argument(
        "--update", type=Path, metavar="FILE", help="write the compact tables between the markers of this file"
    )
    parser.add_argument(
        "--block", help="with --update: the block `<!-- benchmarks-BLOCK:start -->` (default: `benchmarks:start`)"
    )
    parser.add_argument(
        "--noise",
        action="store_true",
        help="the runs repeat one pass: print each benchmark's run-to-run spread and a threshold",
    )
    args = parser.parse_args(argv)
    runs = [json.loads(path.read_text()) for path in args.runs]
    if args.noise:
        print(noise(runs)[0], end="")
        return
    if args.update:
        update(args.update, "\n".join(render_compact(run) for run in runs), args.block)
        return
    print("\n".join(render(run, heading="####") for run in runs), end="")


if __name__ == "__main__":
    main()
