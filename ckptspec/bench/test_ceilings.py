"""Ceilings measured in the same run, for the same bytes: what the machine allows at best.

- `memcpy`: a torch copy into a preallocated host buffer (the floor of a stall with a correct snapshot).
- `write-pagecache` / `write-fsync`: one sequential write of the bytes into a new file of the bench
  directory, without and with fsync (the floors of page-cache and durable writes).
The D2H ceilings (pinned and pageable copies) are in test_d2h.py.
"""

from __future__ import annotations

import os

import torch

from ckptspec.bench.harness import REGRESSION, record
from ckptspec.bench.workload import random_bytes

CHUNK = 64 << 20  # bytes per write() call
ROUNDS_FACTOR = 3  # ceilings are cheap and summarised by their fastest round: give them more rounds


@REGRESSION
def test_memcpy(benchmark, bench):
    src = torch.randint(0, 256, (bench.size,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    bench.run(benchmark, lambda: dst.copy_(src), warmup=1, rounds=ROUNDS_FACTOR * bench.rounds)
    record(benchmark, bench, "ceiling", "memcpy")


def write_file(path: str, data: memoryview, fsync: bool) -> None:
    """Write `data` sequentially into a new file at `path`, then fsync it if asked."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        offset = 0
        while offset < len(data):
            offset += os.write(fd, data[offset : offset + CHUNK])
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def _bench_write(benchmark, bench, paths, fsync: bool) -> None:
    data, box = random_bytes(bench.size), {}

    def setup():
        box["path"] = paths.new()

    bench.run(
        benchmark,
        lambda: write_file(box["path"], data, fsync),
        setup=setup,
        teardown=lambda: paths.remove(box["path"]),
        warmup=1,
        rounds=ROUNDS_FACTOR * bench.rounds,
    )


def test_write_pagecache(benchmark, bench, paths):
    _bench_write(benchmark, bench, paths, fsync=False)
    record(benchmark, bench, "ceiling", "write-pagecache")


@REGRESSION
def test_write_fsync(benchmark, bench, paths):
    _bench_write(benchmark, bench, paths, fsync=True)
    record(benchmark, bench, "ceiling", "write-fsync")
