"""An S3 endpoint that goes away mid-save, or answers 5xx for the metadata, during a save through
Multi-Storage Client, on two ranks.

The endpoint is the storage suite's (the fixture `s3` of ckptspec.spec.harness.s3, which
ckptspec/faults/conftest.py imports): moto's S3 server on loopback with a fault proxy in front of it. The previous checkpoint is saved through the profile `s3` (straight to
the server), the faulty one through `s3-faulty` (through the proxy), into the same bucket. The
storage suite covers each kind of failed request on one rank (clause MSC-3).
"""

import os
import uuid
from dataclasses import dataclass

import pytest

from ckptspec.faults import saves
from ckptspec.spec.drivers.bounds import BOUND, EXIT_BOUND
from ckptspec.spec.drivers.faults.tmpdirs import on_ranks
from ckptspec.spec.harness import HUNG, async_core, close_quietly, current_target, outcome_of, world
from ckptspec.spec.harness.shared_runs import shared

WORLD = 2
FAULTS = {  # test id (phase first) -> (what the proxy does, in words); 5xx on data objects alone: MSC-3
    "write-gone": (lambda proxy: proxy.die_after_puts(1), "gone after the first object"),
    "finalize-5xx": (lambda proxy: proxy.fail_puts(503, ".metadata"), "503 for .metadata"),
}


def _save_old_then_faulty(config, prefix):
    rank, world_size = world()
    os.environ["MSC_CONFIG"] = config  # before the worker starts: it keeps this environment
    save = saves.DcpSave(current_target(), use_msc=True)
    queue = async_core().AsyncCallsQueue(persistent=True)
    save.save(queue, f"msc://s3/{prefix}/old", 0, rank, world_size)
    outcome = outcome_of(
        save.save,
        queue,
        f"msc://s3-faulty/{prefix}/new",
        1,
        rank,
        world_size,
        bound=BOUND,
        what="a save to an S3 endpoint that fails",
    )
    close_quietly(queue, abort=True, bound=EXIT_BOUND)
    return outcome


@dataclass(frozen=True)
class FaultySave:
    outcomes: list  # of the save hit by the fault, per rank
    committed: list  # the .metadata objects it wrote
    old_loads: str  # "" if the previous checkpoint loads exactly, else why not


def _faulty_save(s3, tmp_path_factory, fault: str) -> FaultySave:
    """The run of a save hit by `fault` and what it left, made once per session for FI-S3-1 and its weak level
    (the endpoint is this worker's: the facts are read here)."""
    inject, _ = FAULTS[fault]

    def make():
        prefix = uuid.uuid4().hex
        inject(s3.proxy)
        try:
            outcomes = on_ranks(WORLD, _save_old_then_faulty, s3.config_path, prefix, timeout=120)
        finally:
            s3.proxy.heal()
        committed = [k for k in s3.keys(f"{prefix}/new/") if k.endswith(".metadata")]
        return FaultySave(outcomes, committed, _old_loads(s3, prefix))

    return shared(tmp_path_factory, f"s3-{fault}", make)


def _old_loads(s3, prefix) -> str:
    previous = os.environ.get("MSC_CONFIG")
    os.environ["MSC_CONFIG"] = s3.config_path
    try:
        saves.DcpSave(current_target(), use_msc=True).assert_loads(f"msc://s3/{prefix}/old", 0, WORLD)
    except AssertionError as exc:
        return str(exc)
    finally:
        if previous is None:
            os.environ.pop("MSC_CONFIG")
        else:
            os.environ["MSC_CONFIG"] = previous
    return ""


def _assert_nothing_committed_and_the_old_loads(run: FaultySave, words: str) -> None:
    assert not run.committed, f"S3 endpoint {words}: the failed save wrote {run.committed}"
    assert not run.old_loads, f"S3 endpoint {words}, the previous checkpoint: {run.old_loads}"


@pytest.mark.spec("FI-S3-1")
@pytest.mark.needs("storage_writer", "msc", "persistent_caller")
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_object_store_fault_fails_the_save_on_every_rank(s3, tmp_path_factory, fault):
    words = FAULTS[fault][1]
    run = _faulty_save(s3, tmp_path_factory, fault)
    assert run.outcomes == ["CheckpointException"] * WORLD, f"S3 endpoint {words}: outcome per rank {run.outcomes}"
    _assert_nothing_committed_and_the_old_loads(run, words)


@pytest.mark.spec("FI-S3-1w")
@pytest.mark.needs("storage_writer", "msc", "persistent_caller")
@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_object_store_fault_never_passes_for_saved(s3, tmp_path_factory, fault):
    words = FAULTS[fault][1]
    run = _faulty_save(s3, tmp_path_factory, fault)
    outcomes = run.outcomes
    assert "returned" not in outcomes, f"S3 endpoint {words}: outcome per rank {outcomes}, but no rank may return"
    assert any(o != HUNG for o in outcomes), (
        f"S3 endpoint {words}: outcome per rank {outcomes}, but a rank should raise within {BOUND:g}s"
    )
    _assert_nothing_committed_and_the_old_loads(run, words)
