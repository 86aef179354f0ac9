"""The goodput pictures, drawn from a run's JSON with matplotlib (an optional dependency: the `bench` extra).

    python -m ckptspec.bench.goodput_plot RUN.json   # writes RUN-steps.png and RUN-interval.png next to RUN.json
    write(output_json, json_path)                # the same from a hook; ImportError without matplotlib

- `RUN-steps.png`: each peer's step times over its run at the middle save interval, in steps of that run
  (its median step without a save in flight is 1), steps that began with a save in flight in orange, and
  each save marked at its step by its stall (the call plus any wait for the previous save). Log scale.
- `RUN-interval.png`: goodput against the save interval, one line per peer; a peer with a wrong snapshot
  is dashed and labelled so.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from ckptspec.bench import goodput_summary
from ckptspec.bench.figures import BenchmarkRun

__all__ = ["paths_for", "write"]


def paths_for(json_path: Path) -> tuple[Path, Path]:
    """Where the pictures of the run stored at `json_path` go: (steps, interval)."""
    stem = json_path.with_suffix("")
    return Path(f"{stem}-steps.png"), Path(f"{stem}-interval.png")


def write(output_json: dict, json_path: Path) -> list[Path]:
    """Draw both pictures of a run next to its JSON; [] if the run has no goodput rows.

    Raises ImportError when matplotlib is not installed.
    """
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    run = BenchmarkRun(output_json)
    found = goodput_summary.figures(run)
    if not found:
        return []
    steps_png, interval_png = paths_for(json_path)
    _steps(run, found, steps_png)
    _interval(run, found, interval_png)
    return [steps_png, interval_png]


# One colour per method, the same in both pictures: impl reds, NVRx purples, Megatron-Core browns,
# dcp.async_save greens, the synchronous saves greys; `dcp` peers draw circles, `torch` peers squares.
_COLORS = {
    "impl": "tab:red",
    "impl-temporal": "salmon",
    "nvrx": "tab:purple",
    "nvrx-temporal": "plum",
    "mcore": "saddlebrown",
    "mcore-temporal": "burlywood",
    "async_save-thread": "tab:green",
    "async_save-process": "yellowgreen",
    "async_save-pinned": "darkgreen",
    "async_save-staged": "teal",
    "save": "tab:gray",
}


def _style(peer: str) -> dict:
    if peer == goodput_summary.BASELINE:
        return {"color": "black", "marker": "o"}
    family, method = peer.split(":")
    return {"color": _COLORS.get(method, "tab:blue"), "marker": "o" if family == "dcp" else "s"}


def _steps(run: BenchmarkRun, found, path: Path) -> None:
    import matplotlib.pyplot as plt

    intervals = sorted({n for _, n in found})
    interval = intervals[len(intervals) // 2]
    peers = goodput_summary.order(found, interval)
    ncols = 4
    nrows = math.ceil(len(peers) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4 * ncols, 2.6 * nrows), sharex=True, sharey=True, squeeze=False)
    for ax in axes.flat[len(peers) :]:
        ax.set_visible(False)
    for ax, peer in zip(axes.flat, peers, strict=False):
        f = found[peer, interval]
        row = run.get(goodput_summary.FIGURE, peer, interval=interval)[0]
        base = f.step_s
        x = range(1, len(row["step_s"]) + 1)
        y = [t / base for t in row["step_s"]]
        ax.plot(x, y, color="0.55", linewidth=0.8)
        busy = [(i, v) for i, v, flag in zip(x, y, row["in_flight"], strict=True) if flag]
        if busy:
            ax.scatter(*zip(*busy, strict=True), s=6, color="tab:orange", zorder=3, label="save in flight")
        saves = row["saves"]
        if saves:
            ax.scatter(
                [s["step"] for s in saves],
                [max((s["wait_s"] + s["call_s"]) / base, 1e-3) for s in saves],
                marker="v",
                s=22,
                color="tab:red",
                zorder=4,
                label="stall of a save",
            )
        wrong = peer in goodput_summary.wrong_peers(found)
        title = f"{peer}: {f.slowdown * 100:+.1f}%" + (" wrong snapshot (CPU tensors)" if wrong else "")
        ax.set_title(title, fontsize=9, color="tab:red" if wrong else "black")
        ax.set_yscale("log")
        ax.axhline(1.0, color="tab:blue", linewidth=0.6, linestyle=":")
        ax.grid(True, which="major", linewidth=0.3)
    for ax in axes[-1]:
        ax.set_xlabel("step")
    for ax in axes[:, 0]:
        ax.set_ylabel("time / step time")
    handles, labels = [], []
    for ax in axes.flat:
        for h, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label not in labels:
                handles.append(h)
                labels.append(label)
    fig.legend(handles, labels, loc="upper right", fontsize=8)
    fig.suptitle(f"Step time while saving every {interval} steps\n{run.label}", fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.95))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _interval(run: BenchmarkRun, found, path: Path) -> None:
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullLocator

    intervals = sorted({n for _, n in found})
    peers = goodput_summary.order(found, intervals[-1])
    fig, ax = plt.subplots(figsize=(10.5, 5.5))
    for peer in peers:
        points = [(n, found[peer, n].goodput) for n in intervals if (peer, n) in found]
        wrong = peer in goodput_summary.wrong_peers(found)
        ax.plot(
            *zip(*points, strict=True),
            markersize=4,
            linewidth=1.2,
            linestyle="--" if wrong else "-",
            label=peer + (" (wrong snapshot, CPU tensors)" if wrong else ""),
            **_style(peer),
        )
    ax.set_xscale("log")
    ax.set_xticks(intervals, [str(n) for n in intervals])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlabel("save every N steps")
    ax.set_ylabel("goodput = 1 / (1 + slowdown)")
    ax.grid(True, linewidth=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(f"Goodput against save interval\n{run.label}", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="pytest-benchmark JSON of a goodput run")
    args = parser.parse_args(argv)
    for written in write(json.loads(args.run.read_text()), args.run):
        print(written)


if __name__ == "__main__":
    main()
