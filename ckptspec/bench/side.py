"""A measured saver in a process of its own, saving when its driver says so (ckptspec/bench/sides.py).

    python side.py --impl ADAPTER --scratch DIR --size-mib 32 --tensors 64 [--world 1] [--threads 1] [--phases] [--device cpu]

Run by path, never imported: a side may run in another checkout or another interpreter, where `ckptspec` (and the
user's library) are that side's own. So this file uses only what every ckptspec release since 0.3.0 has:
`load_target`, `protocol_saver`, `checkpoint_format`.

The state dict: `--tensors` equal float32 tensors of `--size-mib` in all, or with CKPTSPEC_SIDE_LAYOUT=transformer
(a peer's variable) a scaled-down transformer of about those bytes, `--tensors` // 36 layers of 12 weights and
biases, each with Adam's two moments, plus Adam's step and the RNG state.

With `--world N` this process is rank 0 of a gloo group of N; it starts ranks 1..N-1 (this file again, with
`--rank`), hands each request on to them, and answers for all: every rank saves its own `--size-mib` (its keys
named by its rank, so a save writes N times the bytes).

`--device cuda` puts every rank's tensors on the GPU, rank r on cuda:r (so N ranks need N GPUs), and makes the group
"cpu:gloo,cuda:nccl": DCP's async_save refuses a group without a CPU backend, the savers' own collectives on CPU
objects go over gloo, and NCCL carries what a library reduces on the GPU (NVRx's and Megatron-Core's finalize).
Without a GPU (or with fewer GPUs than ranks) the side refuses at start, replying an error that says so (no
traceback). `--device cpu`, the default, is what every CPU run measured: gloo, CPU tensors.

Protocol: one JSON request per line on stdin, one JSON reply per line on the file descriptor the driver reads (the
process's original stdout; everything the library prints goes to stderr). Requests:

    {"op": "save", "path": P, "verify": bool}  each rank: start(), staged(), update every tensor in place (the
        next step), wait(). Reply, per rank in "ranks" and rank 0's at the top: "start" (start() returned),
        "stall" (staged() returned), "committed" (wait() returned), in seconds from start(); "update" (the
        in-place update between staged() and wait(), which a background write overlaps); "data_last" and
        "metadata": the last modification of the checkpoint's data files and of its metadata file (a name
        starting with "."), in seconds from start() by the wall clock (None where there is none); with verify,
        "snapshot": whether P read back through the target's format holds the values from before the update.
    {"op": "close"}                             close the saver and the process group; reply {"closed": true}.

Before it handles request n, each rank calls access("/ckptspec-side-mark-n"): a system call a tracer sees, so that
a trace of the process tree can be split into what each request made. The first reply, before any request, is
{"ready": true, "target", "version", "torch", "world"}. An error is replied as {"error": "..."}; the process exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

MARK = "/ckptspec-side-mark-"
PHASES_ENV = "CKPTSPEC_IMPL_PHASES"  # ckptspec/impl/phases.py (a side never imports impl itself)
LAYOUT_ENV = "CKPTSPEC_SIDE_LAYOUT"  # "flat" (default): `--tensors` equal tensors; "transformer": _transformer


class SideRefused(Exception):
    """The side cannot run as asked (no GPU for --device cuda): replied as an error, without a traceback."""


def device_problem(device: str, world: int) -> str | None:
    """Why `device` cannot hold `world` ranks here (one GPU per rank with cuda), or None."""
    if device == "cpu":
        return None
    import torch

    if not torch.cuda.is_available():
        return f"--device cuda: no CUDA device here (torch {torch.__version__}: torch.cuda.is_available() is False)"
    if world > torch.cuda.device_count():
        return f"--device cuda with {world} ranks needs {world} GPUs (one per rank), found {torch.cuda.device_count()}"
    return None


# A transformer layer as a state dict holds it: 12 weights and biases, each with Adam's two moments.
_LAYER = (
    ("ln1.weight", (1,)),
    ("ln1.bias", (1,)),
    ("attn.qkv.weight", (3, 1)),
    ("attn.qkv.bias", (3,)),
    ("attn.out.weight", (1, 1)),
    ("attn.out.bias", (1,)),
    ("ln2.weight", (1,)),
    ("ln2.bias", (1,)),
    ("mlp.up.weight", (4, 1)),
    ("mlp.up.bias", (4,)),
    ("mlp.down.weight", (1, 4)),
    ("mlp.down.bias", (1,)),
)
PER_LAYER = 3 * len(_LAYER)  # each weight, its exp_avg and its exp_avg_sq


def _transformer(size_mib: float, tensors: int, rank: int, device: str) -> dict:
    """A scaled-down transformer's model and Adam state: `tensors` // PER_LAYER layers (at least 1) of width h such
    that the bytes are about `size_mib`, plus Adam's step and the RNG state."""
    import torch

    layers = max(1, tensors // PER_LAYER)
    # the weights hold 12 h**2 elements per layer (qkv 3, out 1, up 4, down 4); the biases and norms only ~13 h
    h = max(1, int((size_mib * (1 << 20) / 4 / 3 / layers / 12) ** 0.5))
    generator = torch.Generator(device=device).manual_seed(rank)
    model: dict = {}
    for layer in range(layers):
        for name, shape in _LAYER:
            dims = tuple(d * h for d in shape)
            key = f"r{rank}.layers.{layer}.{name}"
            for suffix in ("", ".exp_avg", ".exp_avg_sq"):
                model[key + suffix] = torch.randn(dims, generator=generator, device=device)
    return {"model": model, "step": 1000, "adam_step": layers, "rng": torch.get_rng_state()}


def _state_dict(size_mib: float, tensors: int, rank: int, device: str = "cpu") -> dict:
    import torch

    if os.environ.get(LAYOUT_ENV, "flat") == "transformer":
        return _transformer(size_mib, tensors, rank, device)
    per_tensor = max(1, int(size_mib * (1 << 20)) // 4 // tensors)
    if device == "cpu":
        generator = torch.Generator().manual_seed(rank)
        model = {f"r{rank}.t{i:05d}": torch.randn(per_tensor, generator=generator) for i in range(tensors)}
    else:  # drawn on the GPU itself: 16 GiB drawn on the CPU and copied would take longer than the saves
        generator = torch.Generator(device=device).manual_seed(rank)
        model = {
            f"r{rank}.t{i:05d}": torch.randn(per_tensor, generator=generator, device=device) for i in range(tensors)
        }
        torch.cuda.synchronize(device)
    return {"model": model, "step": 1000}


def _update(state: dict) -> None:
    for t in state["model"].values():
        t.neg_()
    first = next(iter(state["model"].values()), None)
    if first is not None and first.is_cuda:  # the update's time is its kernels' (they run after the snapshot's copies)
        import torch

        torch.cuda.current_stream(first.device).synchronize()


def _holds_before_update(fmt, path: str, state: dict) -> bool:
    import torch

    template = {"model": {k: torch.zeros_like(t) for k, t in state["model"].items()}, "step": 0}
    loaded = fmt.load(path, template)
    return all(torch.equal(loaded["model"][k], -t) for k, t in state["model"].items())


def _file_times(path: str, wall_start: float) -> dict:
    data: list[float] = []
    meta: list[float] = []
    for root, _, names in os.walk(path):
        for name in names:
            (meta if name.startswith(".") else data).append(os.stat(os.path.join(root, name)).st_mtime)
    return {
        "data_last": max(data) - wall_start if data else None,
        "metadata": max(meta) - wall_start if meta else None,
    }


def _marks_since(wall_start: float) -> dict:
    """impl's phase marks made since `wall_start` (with --phases): name -> [first, last] in seconds from it."""
    path = os.environ.get(PHASES_ENV)
    if not path or not os.path.exists(path):
        return {}
    marks: dict = {}
    with open(path) as f:
        for line in f:
            name, at, _ = line.rstrip("\n").split("\t")
            t = float(at) - wall_start
            if t >= 0:
                first, last = marks.get(name, (t, t))
                marks[name] = [min(first, t), max(last, t)]
    return marks


def _save(saver, fmt, state: dict, request: dict, rank: int) -> dict:
    wall = time.time()
    t0 = time.perf_counter()
    handle = saver.start(state, request["path"])
    t1 = time.perf_counter()
    handle.staged()
    t2 = time.perf_counter()
    _update(state)
    t_update = time.perf_counter() - t2
    handle.wait()
    t3 = time.perf_counter()
    result: dict[str, Any] = {
        "rank": rank,
        "start": t1 - t0,
        "stall": t2 - t0,
        "committed": t3 - t0,
        "update": t_update,
    }
    if rank == 0:
        result.update(_file_times(request["path"], wall))
        marks = _marks_since(wall)
        if marks:
            result["marks"] = marks
    if request.get("verify"):
        result["snapshot"] = _holds_before_update(fmt, request["path"], state)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--impl", required=True)
    parser.add_argument("--scratch", required=True)
    parser.add_argument("--size-mib", type=float, required=True)
    parser.add_argument("--tensors", type=int, required=True)
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1, help="the trainer's torch threads")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the state dict's tensors live")
    parser.add_argument("--phases", action="store_true", help="report impl's phase marks (CKPTSPEC_IMPL_PHASES)")
    args = parser.parse_args()
    if args.phases:  # before the target is imported: impl reads it then, and its worker inherits it
        os.environ[PHASES_ENV] = os.path.join(args.scratch, f"phases-{args.rank}.tsv")
    replies = os.dup(1)
    os.dup2(2, 1)  # the library's own prints must not reach the driver's channel
    sys.stdout = sys.stderr
    others: list[subprocess.Popen] = []

    def reply(message: dict) -> None:
        os.write(replies, (json.dumps(message) + "\n").encode())

    def from_others() -> list[dict]:
        answers = []
        for child in others:
            assert child.stdout is not None
            answer = json.loads(child.stdout.readline() or '{"error": "a rank exited"}')
            if "error" in answer:
                raise RuntimeError(f"rank {others.index(child) + 1}: {answer['error']}")
            answers.append({k: v for k, v in answer.items() if k != "ranks"})
        return answers

    try:
        if args.rank == 0:
            for rank in range(1, args.world):
                command = [sys.executable, __file__, *sys.argv[1:], "--rank", str(rank)]
                others.append(subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE))
        import torch

        refused = device_problem(args.device, args.world)  # before anything else is imported: at once
        if refused:
            raise SideRefused(refused)
        import torch.distributed as dist

        torch.set_num_threads(args.threads)  # a loaded small machine stalls parallel kernels on descheduled threads
        from ckptspec.spec.harness import load_target
        from ckptspec.spec.harness.surface.loading import checkpoint_format
        from ckptspec.spec.harness.surface.saver_api import protocol_saver

        device = "cpu" if args.device == "cpu" else f"cuda:{args.rank}"
        backend = "gloo"
        if args.device == "cuda":
            torch.cuda.set_device(args.rank)
            backend = "cpu:gloo,cuda:nccl"
        store = dist.FileStore(os.path.join(args.scratch, "store"), args.world)
        timeout = timedelta(seconds=300)
        dist.init_process_group(backend, store=store, rank=args.rank, world_size=args.world, timeout=timeout)
        target = load_target(args.impl)
        fmt = checkpoint_format(target)
        saver = protocol_saver(target, persistent=True)
        state = _state_dict(args.size_mib, args.tensors, args.rank, device)
        ready = {"ready": True, "target": target.name, "version": target.version, "torch": torch.__version__}
        ready.update(device=args.device, backend=backend)
        if args.device == "cuda":
            ready["gpu"] = torch.cuda.get_device_name(args.rank)
        from_others()
        reply({**ready, "world": args.world})
        for n, line in enumerate(sys.stdin):
            os.access(f"{MARK}{n}", os.F_OK)  # a system call a counted run splits its trace at (sides.py)
            for child in others:
                assert child.stdin is not None
                child.stdin.write(line.encode())
                child.stdin.flush()
            request = json.loads(line)
            if request["op"] == "close":
                saver.close()
                dist.destroy_process_group()
                from_others()
                reply({"closed": True})
                for child in others:
                    child.wait(60)
                return 0
            mine = _save(saver, fmt, state, request, args.rank)
            reply({**mine, "ranks": [mine, *from_others()]})
        reply({"error": "the driver closed the request channel without a close request"})
        return 1
    except SideRefused as exc:
        reply({"error": str(exc)})
        return 1
    except BaseException as exc:  # the driver shows this and stops; the traceback goes to stderr
        traceback.print_exc()
        reply({"error": f"{type(exc).__name__}: {exc}"})
        return 1
    finally:
        for child in others:
            if child.poll() is None:
                child.kill()
                child.wait()


if __name__ == "__main__":
    sys.exit(main())
