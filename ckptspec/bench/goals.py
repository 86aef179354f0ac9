"""The performance goals of impl, each checked against one benchmark run's figures (a Markdown checklist)."""

from __future__ import annotations

from ckptspec.bench.figures import (
    BenchmarkRun,
    MiB,
    floor_of,
    fmt_bytes,
    fmt_ratio,
    fmt_time,
    quotient,
    seconds_of,
    snapshot_verdict,
)

__all__ = ["goals"]

OVERLAPPED = ("dcp:impl-overlapped", "dcp:impl-overlapped-clone")  # the second on a GPU only
RETURN_LIMIT = 0.05  # the overlapped save's return, against the floor of its bytes (issue 47)
DURABLE_LIMIT = 1.05  # time to committed against a synchronous dcp.save of the same state dict
# impl's stall against the floor of its bytes, median to median (issue 62): memcpy on a CPU-only machine, the
# pinned device-to-host copy on a GPU
STALL_LIMIT_CPU, STALL_LIMIT_GPU = 1.05, 1.10


def _goal(text: str, value: float | None, limit: float, measured: str) -> str:
    if value is None:
        return f"- [ ] {text}: not measured in this run"
    mark = "x" if value <= limit else " "
    return f"- [{mark}] {text}: {measured}"


def goals(run: BenchmarkRun) -> list[str]:
    """The performance goals of impl, checked against this run's figures."""
    lines = []
    gpu = bool(run.info.get("gpu"))
    for family in ("dcp", "torch"):
        impl = run.one("stall", f"{family}:impl")
        nvrx = run.one("stall", f"{family}:nvrx")
        if impl is None:
            lines.append(f"- [ ] `{family}:impl`: not measured in this run")
            continue
        floor_name, floor = floor_of(run, impl["bytes"], impl.get("device", "cpu"))
        limit = STALL_LIMIT_GPU if gpu else STALL_LIMIT_CPU
        ratio = impl["seconds"] / floor if floor else None
        correct = impl.get("snapshot") == "correct"
        lines.append(
            _goal(
                f"`{family}:impl` stall <= {limit}x the {floor_name} floor, snapshot correct",
                ratio if correct else float("inf"),
                limit,
                f"{fmt_ratio(impl['seconds'], floor)}, {snapshot_verdict(impl)}",
            )
        )
        if nvrx is not None:
            lines.append(
                _goal(
                    f"`{family}:impl` stall no worse than `{family}:nvrx`",
                    impl["seconds"] / nvrx["seconds"],
                    1.0,
                    f"{fmt_time(impl['seconds'])} vs {fmt_time(nvrx['seconds'])} (nvrx: {snapshot_verdict(nvrx)})",
                )
            )
    for peer in OVERLAPPED[: 2 if gpu else 1]:
        lines += _overlapped(run, gpu, peer)
    sync = run.one("durable", "dcp:save")
    for peer in ("dcp:impl", *OVERLAPPED):
        impl = run.one("durable", peer)
        if impl is None and peer in OVERLAPPED:
            continue
        lines.append(
            _goal(
                f"`{peer}` time to durable <= {DURABLE_LIMIT}x synchronous `dcp.save`",
                quotient(impl, sync),
                DURABLE_LIMIT,
                fmt_ratio(seconds_of(impl), seconds_of(sync)),
            )
        )
    for executor in ("thread", "process"):
        peer = f"dcp:async_save-{executor}"
        for figure in ("stall", "durable"):
            mine, theirs = run.one(figure, "dcp:impl"), run.one(figure, peer)
            lines.append(
                _goal(
                    f"`dcp:impl` ahead of `{peer}` on {figure}",
                    quotient(mine, theirs),
                    1.0,
                    f"{fmt_time(seconds_of(mine))} vs {fmt_time(seconds_of(theirs))}",
                )
            )
    memory = run.one("memory", "dcp:impl")
    if memory is None:
        lines.append("- [ ] `dcp:impl` memory: not measured in this run")
    else:
        m = memory["memory"]
        lines.append(
            _goal(
                "`dcp:impl` peak extra host memory <= 1.1x staged bytes",
                m["peak_extra_bytes"] / m["staged_bytes"],
                1.1,
                fmt_ratio(m["peak_extra_bytes"], m["staged_bytes"]),
            )
        )
        allowance = 16 * MiB + m["staged_bytes"] // 100
        lines.append(
            _goal(
                f"`dcp:impl` no growth over {m['saves']} saves (within 16 MiB + 1% of staged)",
                m["growth_bytes"] / allowance,
                1.0,
                fmt_bytes(m["growth_bytes"]),
            )
        )
    if gpu:
        for peer in ("preload:impl", "stage:impl"):
            rows = run.get("d2h", peer)
            if rows:
                largest = max(rows, key=lambda r: r["bytes"])
                ceiling = run.ceiling_seconds("d2h-pinned", largest["bytes"])
                lines.append(
                    _goal(
                        f"`{peer}` D2H >= 80% of the pinned copy ({fmt_bytes(largest['bytes'])})",
                        largest["seconds"] / ceiling * 0.8 if ceiling else None,
                        1.0,
                        fmt_ratio(ceiling, largest["seconds"]),
                    )
                )
    return lines


def _overlapped(run: BenchmarkRun, gpu: bool, peer: str) -> list[str]:
    """The goals of impl's overlapped staging: its return, and its stall until the state may change, each against
    the floor of its bytes (memcpy, or the pinned device-to-host copy on a GPU), measured in this run."""
    stall = run.one("stall", peer)
    if stall is None:
        return [f"- [ ] `{peer}`: not measured in this run"]
    floor_name, floor = floor_of(run, stall["bytes"], stall.get("device", "cpu"))
    phases = stall.get("phases", {})
    returned = phases.get("plan", 0.0) + phases.get("schedule", 0.0) if "schedule" in phases else None
    correct = stall.get("snapshot") == "correct"
    lines = [
        _goal(
            f"`{peer}` returns within {RETURN_LIMIT}x the {floor_name} floor",
            returned / floor if returned is not None and floor else None,
            RETURN_LIMIT,
            fmt_ratio(returned, floor) if returned is not None else "-",
        )
    ]
    where = "" if gpu else " (a GPU goal; this run's CPU figure)"
    lines.append(
        _goal(
            f"`{peer}` stall until the state may change <= 1.0x the {floor_name} floor, snapshot correct{where}",
            stall["seconds"] / floor if floor and correct else (None if not floor else float("inf")),
            1.0,
            f"{fmt_ratio(stall['seconds'], floor)}, {snapshot_verdict(stall)}",
        )
    )
    return lines
