"""Host (and GPU) memory of one peer over consecutive saves, measured in a process of its own.

    python -m ckptspec.bench.memory --peer dcp:impl --size-mib 1024 --saves 20 --dir DIR --json OUT

Running alone makes every process in the tree the peer's: this trainer and whatever it starts
(persistent worker, forked writers, torch's checkpoint process). Memory is the sum over the tree of
the proportional set size of anonymous and shared memory (Pss_Anon + Pss_Shmem of
/proc/PID/smaps_rollup), so pages shared between trainer and worker count once. File-backed pages
(the libraries) are left out: their PSS changes whenever unrelated processes map the same library.

Protocol: build the state dict; `base` = tree memory; one warm-up save of a 64 KiB state dict
(starts the peer's processes; `runtime_bytes` = what that added); `idle` = tree memory; then
`saves` saves of the state dict, each waited for, while a thread samples the tree every 10 ms.

    peak_extra_bytes   max sample - idle         (staging, writing, anything retained)
    retained_bytes     after the last save - idle
    growth_bytes       after the last save - after the first save
    rss_peak_bytes     largest sum of VmRSS over the tree (counts shared pages once per process)
    shm_peak_bytes     largest total of shared-memory objects (/dev/shm, memfd, SysV) mapped in the tree
    pinned_peak_bytes  largest VmPin + VmLck over the tree (page-locked host memory)
    worker_gpu_bytes   GPU memory of the processes other than the trainer (NVML; GPU only, UNTESTED)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import threading
from datetime import timedelta

import psutil

__all__ = ["TreeSample", "profile", "tree_pss"]

_SHM_PREFIXES = ("/dev/shm/", "/memfd:", "/SYSV")


class TreeSample:
    """Memory of this process and its descendants at one instant."""

    def __init__(self):
        me = psutil.Process()
        pids = [me.pid] + [p.pid for p in me.children(recursive=True)]
        self.pids = pids
        self.pss = sum(_pss(pid) for pid in pids)
        self.shm = _shm_bytes(pids)
        status = [_status_kib(pid) for pid in pids]
        self.rss = sum(s.get("VmRSS", 0) for s in status) * 1024
        self.pinned = sum(s.get("VmPin", 0) + s.get("VmLck", 0) for s in status) * 1024


def tree_pss(root: int, exclude: int | None = None) -> int:
    """Pss_Anon + Pss_Shmem of process `root` and its descendants, `exclude` (a pid) left out (bytes)."""
    try:
        tree = psutil.Process(root)
        pids = [root] + [p.pid for p in tree.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    return sum(_pss(pid) for pid in pids if pid != exclude)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""  # the process exited between listing and reading


def _pss(pid: int) -> int:
    """Proportional set size of pid's anonymous and shared memory (bytes)."""
    total = 0
    for line in _read(f"/proc/{pid}/smaps_rollup").splitlines():
        if line.startswith(("Pss_Anon:", "Pss_Shmem:")):
            total += int(line.split()[1]) * 1024
    return total


def _status_kib(pid: int) -> dict[str, int]:
    """The kB fields of /proc/PID/status (VmRSS, VmPin, VmLck, ...)."""
    fields = {}
    for line in _read(f"/proc/{pid}/status").splitlines():
        name, _, value = line.partition(":")
        if value.strip().endswith(" kB"):
            fields[name] = int(value.split()[0])
    return fields


def _shm_bytes(pids) -> int:
    """Total size of distinct shared-memory objects mapped by `pids` (by inode, largest mapping)."""
    sizes: dict[str, int] = {}
    for pid in pids:
        for line in _read(f"/proc/{pid}/maps").splitlines():
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].startswith(_SHM_PREFIXES):
                start, end = (int(x, 16) for x in fields[0].split("-"))
                key = f"{fields[3]}:{fields[4]}"
                sizes[key] = max(sizes.get(key, 0), end - start)
    return sum(sizes.values())


def _worker_gpu_bytes(pids) -> int | None:
    """GPU memory used by `pids` other than this process (UNTESTED: no GPU where this was written)."""
    import torch

    if not torch.cuda.is_available():
        return None
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    others = set(pids) - {os.getpid()}
    used = [p.usedGpuMemory or 0 for p in pynvml.nvmlDeviceGetComputeRunningProcesses(handle) if p.pid in others]
    return sum(used)


class _Sampler(threading.Thread):
    """Samples the tree every `interval` seconds (and on `take()`), keeping the peaks."""

    def __init__(self, interval: float = 0.01):
        super().__init__(name="memory-sampler", daemon=True)
        self.interval, self.stopped, self.lock = interval, threading.Event(), threading.Lock()
        self.peak_pss = self.peak_rss = self.peak_shm = self.peak_pinned = 0
        self.peak_gpu: int | None = None

    def run(self):
        while not self.stopped.wait(self.interval):
            self.take()

    def take(self) -> TreeSample:
        sample = TreeSample()
        with self.lock:
            self._update(sample)
        return sample

    def _update(self, sample: TreeSample) -> None:
        self.peak_pss = max(self.peak_pss, sample.pss)
        self.peak_rss = max(self.peak_rss, sample.rss)
        self.peak_shm = max(self.peak_shm, sample.shm)
        self.peak_pinned = max(self.peak_pinned, sample.pinned)
        gpu = _worker_gpu_bytes(sample.pids)
        if gpu is not None:
            self.peak_gpu = max(self.peak_gpu or 0, gpu)

    def stop(self):
        self.stopped.set()
        self.join()


def profile(peer_name: str, nbytes: int, saves: int, root: str, device: str = "cpu") -> dict:
    """Run the protocol of the module docstring for one peer; return the figures (bytes)."""
    from ckptspec.bench import peers, workload

    state_dict = workload.make_state_dict(nbytes, device)
    warmup = workload.make_state_dict(64 * 1024, device)
    peer = peers.make_peer(peer_name)
    base = TreeSample().pss
    _save(peer, warmup, os.path.join(root, "warmup"))
    idle = TreeSample().pss
    sampler = _Sampler()
    sampler.start()
    settled = []
    try:
        for i in range(saves):
            _save(peer, state_dict, os.path.join(root, f"save{i}"))
            settled.append(sampler.take().pss)
    finally:
        sampler.stop()
        peer.close()
    return {
        "staged_bytes": workload.staged_bytes(state_dict),
        "saves": saves,
        "runtime_bytes": idle - base,
        "peak_extra_bytes": sampler.peak_pss - idle,
        "retained_bytes": settled[-1] - idle,
        "growth_bytes": settled[-1] - settled[0],
        "rss_peak_bytes": sampler.peak_rss,
        "shm_peak_bytes": sampler.peak_shm,
        "pinned_peak_bytes": sampler.peak_pinned,
        "worker_gpu_bytes": sampler.peak_gpu,
    }


def _save(peer, state_dict, path: str) -> None:
    peer.save(state_dict, path)
    peer.wait()
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.exists(path):
        os.remove(path)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peer", required=True)
    parser.add_argument("--size-mib", type=float, required=True)
    parser.add_argument("--saves", type=int, default=20)
    parser.add_argument("--dir", required=True, help="existing directory for the checkpoints")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", required=True, help="where to write the figures")
    args = parser.parse_args(argv)
    if args.saves < 1:
        parser.error("--saves must be at least 1")
    import torch.distributed as dist

    store_dir = tempfile.mkdtemp(prefix="store-", dir=args.dir)
    dist.init_process_group(
        "gloo",
        store=dist.FileStore(os.path.join(store_dir, "store"), 1),
        rank=0,
        world_size=1,
        timeout=timedelta(seconds=600),
    )
    try:
        figures = profile(args.peer, int(args.size_mib * (1 << 20)), args.saves, args.dir, args.device)
    finally:
        dist.destroy_process_group()
        shutil.rmtree(store_dir)
    with open(args.json, "w") as f:
        json.dump(figures, f)


if __name__ == "__main__":
    main()
