"""The cost of impl's checksums (IN-1): `dcp:impl` with checksums on against off, stall and time to committed.

The checksums are computed in the writer as the bytes pass to the file, so they should cost the trainer
nothing (stall) and the background write about one CRC32 pass over the data (time to committed).
"""

from __future__ import annotations

from time import perf_counter

import pytest

from ckptspec.bench.harness import median, phase_medians, record
from ckptspec.bench.peers import _WriterPeer
from ckptspec.bench.workload import staged_bytes

pytestmark = pytest.mark.xdist_group("benchmarks-save")
FIGURE = "checksums"


@pytest.mark.parametrize("checksums", [pytest.param(True, id="on"), pytest.param(False, id="off")])
def test_checksum_cost(benchmark, bench, process_group, state_dict, paths, checksums):
    """Stall (the timed call) and time to committed of `dcp:impl`, with checksums on or off."""
    # A persistent worker when timing; in smoke mode a fork per save, which needs no worker start.
    peer = _WriterPeer("impl", bench.enabled, checksums=checksums)
    peer.name = "dcp:impl"
    rounds: list[dict] = []
    box: dict = {}

    def setup():
        box["path"] = paths.new()

    def save():
        box["start"] = perf_counter()
        rounds.append(peer.save(state_dict, box["path"]))

    def finish():
        bench.wait(peer)
        rounds[-1]["durable"] = perf_counter() - box["start"]
        paths.remove(box["path"])

    try:
        bench.run(benchmark, save, setup=setup, teardown=finish, warmup=1)
    finally:
        peer.close()
    measured = rounds[-bench.rounds :]
    record(
        benchmark,
        bench,
        FIGURE,
        "dcp:impl",
        family="dcp",
        bytes=staged_bytes(state_dict),
        checksums=checksums,
        durable_s=median(r["durable"] for r in measured),
        phases=phase_medians(measured),
    )
