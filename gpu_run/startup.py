"""Where a GPU node's process start-up time goes: the costs every rank, worker and xdist worker of the suite pays.

    python -m gpu_run.startup [--parallel N] [--out FILE]

Each figure is the wall time of fresh interpreters doing one thing, measured one at a time and then N at once (as
N xdist workers start together): importing torch (the first import reads the CUDA build's libraries from disk),
importing torch and the DCP modules and impl's async core (what a rank or a persistent worker imports),
initialising CUDA (what a process that touches the GPU adds), and `torch.cuda.is_available()` (which some code
calls without needing the GPU). Prints one JSON object; standard library and torch only.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BOUND_S = 300.0
SNIPPETS = {
    "import torch": "import torch",
    "import torch, DCP, impl core": (
        "import torch, torch.distributed, torch.distributed.checkpoint, ckptspec.impl.async_ckpt.core, "
        "ckptspec.impl.async_ckpt.filesystem_async"
    ),
    "import torch + cuda.is_available()": "import torch; torch.cuda.is_available()",
    "import torch + CUDA init": "import torch; torch.zeros(1, device='cuda'); torch.cuda.synchronize()",
}


def _once(code: str) -> float | str:
    """Seconds, or why the interpreter failed (its last line: CUDA initialisation fails without a GPU)."""
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, timeout=BOUND_S, capture_output=True, text=True)
    if done.returncode != 0:
        return "failed: " + (done.stderr.strip().splitlines() or ["(no output)"])[-1][:200]
    return round(time.perf_counter() - start, 3)


def _parallel(code: str, n: int) -> dict[str, float] | str:
    start = time.perf_counter()
    with ThreadPoolExecutor(n) as pool:
        each = list(pool.map(lambda _: _once(code), range(n)))
    wall = round(time.perf_counter() - start, 3)
    times = [t for t in each if isinstance(t, float)]
    if len(times) < len(each):
        return next(t for t in each if isinstance(t, str))
    return {"wall": wall, "slowest": max(times), "fastest": min(times)}


def measure(parallel: int) -> dict:
    figures: dict = {"cores": os.cpu_count(), "python": sys.version.split()[0], "parallel": parallel}
    figures["first import torch (cold files)"] = _once(SNIPPETS["import torch"])
    for name, code in SNIPPETS.items():
        figures[name] = [_once(code) for _ in range(2)]
    for name, code in SNIPPETS.items():
        figures[f"{parallel} at once: {name}"] = _parallel(code, parallel)
    return figures


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpu_run.startup", description=__doc__.split("\n\n")[0])
    parser.add_argument("--parallel", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    text = json.dumps(measure(args.parallel), indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
