"""The mutation score table from `mutation/results.json` (written by `mutation.run`).

    python -m mutation.summary                                print the table
    python -m mutation.summary --update docs/spec-design.md   replace the block between <!-- mutation:start -->
                                                              and <!-- mutation:end -->

Score = killed / (mutants run - equivalent), per impl module and overall, with the 95% Wilson interval of the
overall score (the mutants are a uniform random sample of all of impl's). `mutation/equivalent.toml` lists the
surviving mutants judged equivalent (module, line, operator, and a one-line reason); they count in no denominator.
Entries with `kind = "gpu"` are survivors in code that runs only with a CUDA device: shown in their own column,
out of the score, and counted as survivors in the note's second figure.
A mutant cosmic-ray could not apply (`no_mutation`) counts nowhere either.
"""

from __future__ import annotations

import argparse
import json
import math
import tomllib
from collections import defaultdict
from pathlib import Path

from ckptspec.report.blocks import replace_block

HERE = Path(__file__).resolve().parent
START, END = "<!-- mutation:start -->", "<!-- mutation:end -->"


def equivalent_entries() -> list[dict]:
    """The surviving mutants judged equivalent (mutation/equivalent.toml)."""
    return tomllib.loads((HERE / "equivalent.toml").read_text()).get("mutant", [])


def wilson(killed: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion killed/n."""
    if n == 0:
        return (0.0, 1.0)
    p = killed / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def _key(m: dict) -> tuple[str, int, str]:
    return (m["module"], int(m["line"]), m["operator"])


def render(results: dict, equivalent: list[dict]) -> str:
    kinds = {(e["module"], int(e["line"]), e["operator"]): e.get("kind", "equivalent") for e in equivalent}
    columns = ("killed", "survived", "equivalent", "gpu")
    rows: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(columns, 0))
    for m in results["mutants"]:
        if m["outcome"] == "no_mutation":
            continue
        rows[m["module"]]["killed" if m["outcome"] == "killed" else kinds.get(_key(m), "survived")] += 1
    lines = [
        "| impl module | killed | survived | equivalent | GPU only | score |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    total = dict.fromkeys(columns, 0)
    for module in sorted(rows):
        row = rows[module]
        total = {c: total[c] + row[c] for c in columns}
        score = row["killed"] / max(1, row["killed"] + row["survived"])
        lines.append(f"| `{module}` | {' | '.join(str(row[c]) for c in columns)} | {score:.0%} |")
    killed, n = total["killed"], total["killed"] + total["survived"]
    low, high = wilson(killed, n)
    lines.append(f"| **all** | {' | '.join(str(total[c]) for c in columns)} | **{killed / max(1, n):.1%}** |")
    done, skipped, gpu = len(results["mutants"]), results.get("in_annotations", 0), total["gpu"]
    lines += [
        "",
        f"{results['date']}: {done} of the {results['sampled']} mutants drawn (seed {results['seed']}) have run, "
        f"out of the {results['population']} that cosmic-ray generates for impl outside annotations "
        f"({skipped} more lie inside annotations); score {killed}/{n} = {killed / max(1, n):.1%}, 95% Wilson "
        f"interval {low:.1%} to {high:.1%}; counting the {gpu} GPU-only mutants (code a CPU machine never runs) as "
        f"survivors, {killed}/{n + gpu} = {killed / max(1, n + gpu):.1%}. Command: `{results['command']}`.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", type=Path, default=HERE / "results.json")
    parser.add_argument("--update", type=Path)
    args = parser.parse_args(argv)
    results = json.loads(args.results.read_text())
    equivalent = equivalent_entries()
    block = render(results, equivalent)
    if args.update is None:
        print(block, end="")
    else:
        text = args.update.read_text()
        args.update.write_text(replace_block(text, block, str(args.update), START, END))


if __name__ == "__main__":
    main()
