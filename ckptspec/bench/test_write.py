"""Write throughput: the write of an already planned and staged checkpoint, per writer and destination.

Writers: `dcp:impl` and `dcp:nvrx` run the save function of their FileSystemWriterAsync in this
process (what their worker runs; planning and preload happen before the timed part, finalize
after); `dcp:save` is the whole synchronous `dcp.save` (its planning takes milliseconds);
`torch:save` is `torch.save`. Destinations: `pagecache` (no fsync), `durable` (data fsync'ed),
`msc-posix` and `msc-s3` (multi-storage-client: a POSIX profile, and S3 served by moto on
loopback). FileSystemWriterAsync always fsyncs, so it has no page-cache variant. The MSC ceilings
are one object of the same bytes written through `msc.open` (fsync'ed on POSIX).
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any

import boto3
import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckptspec.bench.adapter_peer import IMPL_PEER, regression_peer
from ckptspec.bench.harness import REGRESSION, SMOKE_PEERS, record, smoke_skip_reason
from ckptspec.bench.peers import plan_write, unavailable
from ckptspec.bench.workload import random_bytes, staged_bytes
from ckptspec.spec.harness.surface.loading import ENV_VAR

PROFILES = {"msc-posix": "ckptspec-bench-posix", "msc-s3": "ckptspec-bench-s3"}
BUCKET = "ckptspec-bench"
CEILING = {
    "pagecache": "write-pagecache",
    "durable": "write-fsync",
    "msc-posix": "msc-posix-raw",
    "msc-s3": "msc-s3-raw",
}
# impl's write is in the regression pass only when it judges impl: an adapter's cost gate measures its saver alone.
IMPL_RUN = regression_peer(os.environ.get(ENV_VAR) or "impl") == IMPL_PEER
CASES = [
    pytest.param("dcp:impl", "durable", marks=REGRESSION if IMPL_RUN else ()),
    ("dcp:nvrx", "durable"),
    ("dcp:save", "durable"),
    ("dcp:save", "pagecache"),
    ("torch:save", "durable"),
    ("torch:save", "pagecache"),
] + [(writer, dest) for dest in ("msc-posix", "msc-s3") for writer in ("dcp:impl", "dcp:nvrx", "dcp:save")]


class WriteStorage:
    """The MSC side of the run: config file, POSIX base directory and S3 bucket."""

    def __init__(self, root, endpoint: str):
        self.posix_root = root / "posix"
        self.s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )
        self.s3.create_bucket(Bucket=BUCKET)
        credentials = {"type": "S3Credentials", "options": {"access_key": "testing", "secret_key": "testing"}}
        profiles = {
            PROFILES["msc-posix"]: {
                "storage_provider": {"type": "file", "options": {"base_path": str(self.posix_root)}}
            },
            PROFILES["msc-s3"]: {
                "storage_provider": {
                    "type": "s3",
                    "options": {"base_path": BUCKET, "endpoint_url": endpoint, "region_name": "us-east-1"},
                },
                "credentials_provider": credentials,
            },
        }
        self.config = root / "msc_config.json"
        self.config.write_text(json.dumps({"profiles": profiles}))

    def remove(self, dest: str, name: str) -> None:
        if dest == "msc-posix":
            local = self.posix_root / name
            shutil.rmtree(local) if local.is_dir() else local.unlink(missing_ok=True)
            return
        listed = self.s3.list_objects_v2(Bucket=BUCKET, Prefix=name).get("Contents", [])
        if listed:
            self.s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": o["Key"]} for o in listed]})


@pytest.fixture(scope="session")
def storage(tmp_path_factory, s3_endpoint):
    return WriteStorage(tmp_path_factory.mktemp("msc"), s3_endpoint)


class Destination:
    """Fresh paths (or msc:// URLs) for one destination, and removal of what was written there."""

    def __init__(self, dest: str, paths, storage: WriteStorage | None):
        self.dest, self.paths, self.storage = dest, paths, storage

    def new(self) -> str:
        path = self.paths.new()
        if self.storage is None:
            return path
        return f"msc://{PROFILES[self.dest]}/{os.path.basename(path)}"

    def remove(self, path: str) -> None:
        if self.storage is None:
            self.paths.remove(path)
        else:
            self.storage.remove(self.dest, path.rsplit("/", 1)[-1])


@pytest.fixture
def destination(request, paths, monkeypatch):
    dest = request.param
    if not dest.startswith("msc-"):
        return Destination(dest, paths, None)
    storage = request.getfixturevalue("storage")
    monkeypatch.setenv("MSC_CONFIG", str(storage.config))
    return Destination(dest, paths, storage)


def _ids(cases):
    return [f"{writer}@{dest}" for writer, dest in (getattr(c, "values", c) for c in cases)]


@pytest.mark.parametrize(("writer", "destination"), CASES, indirect=["destination"], ids=_ids(CASES))
def test_write(benchmark, bench, process_group, state_dict, writer, destination):
    """Throughput of the write alone (see the module docstring for what each writer times)."""
    box = {}

    def setup():
        box["path"] = destination.new()
        box["write"], box["finish"] = _prepare(writer, destination.dest, state_dict, box["path"])

    def teardown():
        box["finish"]()
        destination.remove(box["path"])

    if not bench.enabled and writer not in SMOKE_PEERS:
        pytest.skip(smoke_skip_reason(writer))
    if writer.startswith("dcp:") and writer != "dcp:save" and (reason := unavailable(writer)):
        pytest.skip(reason)
    bench.run(benchmark, lambda: box["write"](), setup=setup, teardown=teardown, warmup=1)
    record(
        benchmark,
        bench,
        "write",
        writer,
        dest=destination.dest,
        ceiling=CEILING[destination.dest],
        bytes=staged_bytes(state_dict),
    )


def _prepare(writer: str, dest: str, state_dict, path: str):
    """(write, finish): the timed write of `state_dict` to `path`, and what completes it afterwards."""
    msc = dest.startswith("msc-")
    if writer == "dcp:save":
        if msc:
            import multistorageclient

            storage_writer: dcp.StorageWriter = multistorageclient.torch.MultiStorageFileSystemWriter(path)
        else:
            storage_writer = dcp.FileSystemWriter(path, sync_files=dest == "durable")
        return lambda: dcp.save(state_dict, storage_writer=storage_writer), lambda: None
    if writer == "torch:save":
        return lambda: _torch_save(state_dict, path, fsync=dest == "durable"), lambda: None
    writer_kwargs: dict[str, Any] = {"use_msc": True} if msc else {}  # passed only where asked for
    planned = plan_write(writer.split(":")[1], state_dict, path, **writer_kwargs)
    save_args = list(planned.save_args)
    if planned.preload_fn is not None:
        save_args[1] = planned.preload_fn()
    return lambda: planned.save_fn(*save_args), planned.finalize_fn


def _torch_save(state_dict, path: str, fsync: bool) -> None:
    with open(path, "wb") as f:
        torch.save(state_dict, f)
        if fsync:
            f.flush()
            os.fsync(f.fileno())


@pytest.mark.parametrize("destination", ["msc-posix", "msc-s3"], indirect=True)
def test_msc_raw(benchmark, bench, destination):
    """Ceiling of an MSC destination: the same bytes as one object through `msc.open`."""
    import multistorageclient as msc

    data, box = random_bytes(bench.size), dict[str, str]()

    def write():
        with msc.open(box["path"], "wb") as f:
            f.write(data)
            f.fsync()

    def setup():
        box["path"] = destination.new()

    bench.run(benchmark, write, setup=setup, teardown=lambda: destination.remove(box["path"]), warmup=1)
    record(benchmark, bench, "ceiling", f"{destination.dest}-raw")
