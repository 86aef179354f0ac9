"""Multi-Storage Client: msc:// URLs on a POSIX profile and on a real S3 endpoint, and object-store failures.

Ranks are told the MSC config file through MSC_CONFIG before anything touches MSC; the workers and children
they start inherit it.
"""

import os
import uuid
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from torch.distributed.checkpoint import CheckpointException

from ckptspec.spec.drivers import saving
from ckptspec.spec.harness.asserts import HUNG, BoundExceeded, assert_equal, attempt, bounded
from ckptspec.spec.harness.ranks.vocabulary import RankFailures
from ckptspec.spec.harness.s3 import BUCKET
from ckptspec.spec.harness.shared_runs import shared

pytestmark = pytest.mark.needs("storage_writer", "msc", "temporal_caller")
SAVE_BOUND = 45.0


def _state():
    return {
        "model": {"w": torch.arange(12.0).view(3, 4).t(), "h": torch.ones(5, dtype=torch.bfloat16)},
        "opt": {"m": torch.arange(6, dtype=torch.int8), "flags": torch.tensor([True, False])},
        "step": 11,
        "name": "run",
        "blob": b"\x00\x01",
        "empty": torch.empty(0, 2),
    }


def _use(config):
    os.environ["MSC_CONFIG"] = config


def _msc_reader(url):
    import multistorageclient as msc

    return msc.torch.MultiStorageFileSystemReader(url, thread_count=2)


class PosixRoundTrip(NamedTuple):
    msc_mismatch: str | None  # loading through MSC's reader: assert_state_dict_equal's message, or None
    stock_mismatch: str | None  # loading with stock FileSystemReader
    files: list


def _posix_round_trip(url, local):
    state = _state()
    saving.async_save(state, url, use_msc=True, thread_count=2)
    through_msc = saving.mismatch(
        saving.load(state, local, reader=_msc_reader(url)), state, f"dcp.load(MultiStorageFileSystemReader({url!r}))"
    )
    stock = saving.mismatch(saving.load(state, local), state, f"dcp.load(FileSystemReader({local!r}))")
    return PosixRoundTrip(through_msc, stock, sorted(os.listdir(local)))


@pytest.mark.spec("MSC-1")
def test_a_posix_profile_checkpoint_loads_through_msc_and_stock_dcp(rank_pool, tmp_path):
    local = str(tmp_path / "ckpt")
    got = rank_pool(1).run(_posix_round_trip, "msc://__filesystem__" + local, local)[0]
    assert got.msc_mismatch is None, got.msc_mismatch
    assert got.stock_mismatch is None, got.stock_mismatch
    assert ".metadata" in got.files, f"the checkpoint directory holds {got.files}"
    assert all(f == ".metadata" or f.endswith(".distcp") for f in got.files), (
        f"the checkpoint directory holds {got.files}"
    )


def _s3_round_trip(config, url):
    _use(config)
    state = _state()
    saving.async_save(state, url, persistent=True, use_msc=True, thread_count=3)
    return saving.mismatch(
        saving.load(state, "unused", reader=_msc_reader(url)), state, f"dcp.load(MultiStorageFileSystemReader({url!r}))"
    )


@pytest.mark.spec("MSC-2")
@pytest.mark.needs("persistent_caller")
def test_an_s3_checkpoint_loads_through_msc(rank_pool, s3):
    prefix = f"{uuid.uuid4().hex}/ckpt"
    problem = rank_pool(1).run(_s3_round_trip, s3.config_path, f"msc://s3/{prefix}")[0]
    assert problem is None, problem
    names = [key[len(prefix) + 1 :] for key in s3.keys(prefix + "/")]
    assert ".metadata" in names, f"the bucket holds {names} under {prefix}/"
    assert all(n == ".metadata" or n.endswith(".distcp") for n in names), f"the bucket holds {names} under {prefix}/"


def _failing_save(config, url, record):
    """A save to `url` that must raise CheckpointException within SAVE_BOUND; what it did ("returned", HUNG or the
    class of what it raised) is also written to `record`, for MSC-3w, which reads it even where the run failed."""
    _use(config)
    state = {"a": torch.arange(256.0), "b": torch.ones(256), "step": 1}
    with pytest.raises(CheckpointException):
        _recording(Path(record), state, url)


def _recording(record, state, url):
    try:
        bounded(
            SAVE_BOUND,
            f"a save to {url}",
            saving.async_save,
            state,
            url,
            use_msc=True,
            thread_count=2,
            bound=SAVE_BOUND,
        )
    except BoundExceeded:
        record.write_text(HUNG)
        raise
    except BaseException as exc:  # CheckpointException is a BaseException
        record.write_text("CheckpointException" if isinstance(exc, CheckpointException) else type(exc).__name__)
        raise
    record.write_text("returned")


FAULTS = {
    "server-gone-mid-save": ("s3-faulty", lambda proxy: proxy.die_after_puts(1)),
    "5xx-on-data": ("s3-faulty", lambda proxy: proxy.fail_puts(500, ".distcp")),
    "5xx-on-metadata": ("s3-faulty", lambda proxy: proxy.fail_puts(503, ".metadata")),
    "missing-bucket": ("s3-missing", lambda proxy: None),
}


class StoreFailure(NamedTuple):
    record: str  # what the save did, as _failing_save wrote it (absent: the rank was stopped first)
    committed: list  # the .metadata objects under the save's prefix afterwards
    error: RankFailures | None  # how the run failed, if it did


def _store_failure(rank_pool, s3, proxy, tmp_path_factory, fault) -> StoreFailure:
    def run():
        profile, inject = FAULTS[fault]
        prefix, record = f"{uuid.uuid4().hex}/ckpt", str(tmp_path_factory.mktemp("msc3") / "outcome")
        inject(proxy)
        try:
            rank_pool(1).run(_failing_save, s3.config_path, f"msc://{profile}/{prefix}", record)
            error = None
        except RankFailures as exc:
            error = exc
        proxy.heal()
        return StoreFailure(record, [k for k in s3.keys(prefix + "/") if k.endswith(".metadata")], error)

    return shared(tmp_path_factory, f"MSC-3-{fault}", run)


@pytest.mark.spec("MSC-3")
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_object_store_errors_raise_checkpoint_exception_and_commit_nothing(
    rank_pool, s3, proxy, tmp_path_factory, fault
):
    run = _store_failure(rank_pool, s3, proxy, tmp_path_factory, fault)
    if run.error is not None:
        raise run.error
    assert not run.committed, f"after the failed save ({fault}) the bucket holds {run.committed}"


@pytest.mark.spec("MSC-3w")
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_object_store_errors_fail_the_save_and_commit_nothing(rank_pool, s3, proxy, tmp_path_factory, fault):
    run = _store_failure(rank_pool, s3, proxy, tmp_path_factory, fault)
    did = Path(run.record).read_text() if os.path.exists(run.record) else "no answer"
    assert did not in ("returned", HUNG, "no answer"), (
        f"a save to the object store ({fault}) did not raise in time: {did}"
    )
    assert not run.committed, f"after the failed save ({fault}) the bucket holds {run.committed}"


class Refusal(NamedTuple):
    error: str  # ValueError at construction, or CheckpointException at planning
    message: str


def _unknown_profile(config, url):
    _use(config)
    try:
        writer = saving.module("filesystem_async").FileSystemWriterAsync(url, use_msc=True)
    except ValueError as exc:
        return Refusal("ValueError", str(exc))
    with pytest.raises(CheckpointException) as info:
        saving.plan({"w": torch.ones(2)}, writer)
    return Refusal("CheckpointException", str(info.value))


@pytest.mark.spec("MSC-4")
def test_an_unknown_profile_is_refused_before_writing(rank_pool, s3):
    refusal = rank_pool(1).run(_unknown_profile, s3.config_path, "msc://no-such-profile/ckpt")[0]
    assert "no-such-profile" in refusal.message, f"the {refusal.error} does not name the unknown profile: {refusal}"


def _without_use_msc(url):
    return attempt(saving.module("filesystem_async").FileSystemWriterAsync, url, named=(ValueError,)).text


@pytest.mark.spec("MSC-5")
def test_an_msc_url_without_use_msc_is_refused(rank_pool):
    url = "msc://s3/some/ckpt"
    assert_equal(
        f"FileSystemWriterAsync({url!r})",
        rank_pool(1).run(_without_use_msc, url)[0],
        "ValueError",
        call="without use_msc=True (it would write to a local 'msc:' directory)",
    )


def _save_once(config, url):
    _use(config)
    saving.async_save({"w": torch.arange(4.0)}, url, use_msc=True)


def _plan_again(config, url):
    _use(config)
    writer = saving.module("filesystem_async").FileSystemWriterAsync(url, use_msc=True)
    with pytest.raises(CheckpointException):
        saving.plan({"w": torch.zeros(4), "v": torch.ones(2)}, writer)


@pytest.mark.spec("MSC-6")
def test_an_object_store_checkpoint_is_not_overwritten(rank_pool, s3):
    prefix = f"{uuid.uuid4().hex}/ckpt"
    url = f"msc://s3/{prefix}"
    rank_pool(1).run(_save_once, s3.config_path, url)
    before = {o["Key"]: o["ETag"] for o in s3.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]}
    rank_pool(1).run(_plan_again, s3.config_path, url)
    after = {o["Key"]: o["ETag"] for o in s3.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]}
    assert after == before, f"refusing to overwrite changed the checkpoint's objects: {before} -> {after}"


NEW = {"w": torch.zeros(4), "v": torch.ones(2)}


def _save_new_over(config, url):
    """Save NEW where _save_once saved: "refused" (CheckpointException), or how the location then differs from NEW."""
    _use(config)
    try:
        saving.async_save(NEW, url, use_msc=True)
    except CheckpointException:
        return "refused"
    return saving.mismatch(saving.load(NEW, "unused", reader=_msc_reader(url)), NEW, f"dcp.load of {url} saved over")


@pytest.mark.spec("MSC-6w")
def test_a_save_over_an_object_store_checkpoint_is_refused_or_overwrites_it_whole(rank_pool, s3):
    prefix = f"{uuid.uuid4().hex}/ckpt"
    url = f"msc://s3/{prefix}"
    rank_pool(1).run(_save_once, s3.config_path, url)  # {"w": arange(4.0)}
    before = {o["Key"]: o["ETag"] for o in s3.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]}
    outcome = rank_pool(1).run(_save_new_over, s3.config_path, url)[0]
    if outcome == "refused":
        after = {o["Key"]: o["ETag"] for o in s3.client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]}
        assert after == before, f"a refused save over the checkpoint changed its objects: {before} -> {after}"
    else:
        assert outcome is None, outcome
