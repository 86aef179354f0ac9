"""Several saves in flight at once never mix (P-ISO-1): each through the real DCP write path, each committing
exactly its own data, whether the second comes from the same saver (the tensors changed in place in between,
as a training step does) or from a second saver with a state dict of its own. At the weak level (P-ISO-1w) the
saves may fail or time out, but what is committed is exactly its own save, and a save every rank saw succeed is
committed."""

import pytest
import torch
from torch.distributed.checkpoint import CheckpointException  # a BaseException, not an Exception

from ckptspec.spec.drivers.protocol_saves import (
    BOUND,
    assert_loads,
    committed,
    expected,
    loader,
    rank_state,
    start,
    wait,
    warm_saver,
)
from ckptspec.spec.harness.asserts import bounded
from ckptspec.spec.harness.ranks import devices, run_on_ranks, world
from ckptspec.spec.harness.strategies import private_copy

pytestmark = pytest.mark.needs("protocol")
NUMEL = 1 << 20  # 4 MiB per rank and save: the first save is still in flight when the second starts


def _copy_into(state: dict, values: dict) -> None:
    """Give the trainer's tensors new values in place (its next training step)."""
    for key, value in values.items():
        if isinstance(value, dict):
            _copy_into(state[key], value)
        elif isinstance(value, torch.Tensor):
            state[key].copy_(value)
        else:
            state[key] = value


def _two_in_flight(tmp, same_saver):
    rank, _ = world()
    first, second = warm_saver(f"{tmp}/first"), None
    savers = [first]
    try:
        state = private_copy(rank_state(rank, 1, NUMEL), devices.current())
        h1 = start(first, state, f"{tmp}/v1")
        if same_saver:
            _copy_into(state, rank_state(rank, 2, NUMEL))
            h2 = start(first, state, f"{tmp}/v2")
        else:
            second = warm_saver(f"{tmp}/second")
            savers.append(second)
            h2 = start(second, private_copy(rank_state(rank, 2, NUMEL), devices.current()), f"{tmp}/v2")
        wait(h1)
        wait(h2)
    finally:
        for saver in savers:
            bounded(BOUND, "close()", saver.close)


@pytest.mark.spec("P-ISO-1")
@pytest.mark.tensor_device
@pytest.mark.parametrize("same_saver", [True, False], ids=["one-saver", "two-savers"])
def test_saves_in_flight_together_each_commit_their_own_data(tmp_path, same_saver):
    run_on_ranks(_two_in_flight, 2, (str(tmp_path), same_saver), timeout=400)
    for version in (1, 2):
        assert_loads(f"{tmp_path}/v{version}", expected(2, version, NUMEL), call=f"{loader()} of save v{version}")


def _two_in_flight_outcome(tmp, same_saver) -> str:
    """What `_two_in_flight` did on this rank: "returned", or the exception (a bound exceeded included)."""
    try:
        _two_in_flight(tmp, same_saver)
    except (Exception, CheckpointException) as exc:  # any failure is allowed here; what was committed is judged
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return "returned"


@pytest.mark.spec("P-ISO-1w")
@pytest.mark.tensor_device
@pytest.mark.parametrize("same_saver", [True, False], ids=["one-saver", "two-savers"])
def test_saves_in_flight_together_never_commit_the_other_saves_data(tmp_path, same_saver):
    outcomes = run_on_ranks(_two_in_flight_outcome, 2, (str(tmp_path), same_saver), timeout=400)
    problems = []
    for version in (1, 2):
        path = f"{tmp_path}/v{version}"
        if committed(path, 2):
            try:
                assert_loads(path, expected(2, version, NUMEL), call=f"{loader()} of save v{version}")
            except (Exception, CheckpointException) as exc:  # committed but not loading as its own save: the failure
                problems.append(f"save v{version} is committed but is not its own data: {type(exc).__name__}: {exc}")
        elif all(outcome == "returned" for outcome in outcomes):
            problems.append(f"every rank's wait() returned, but save v{version} is not committed")
    assert not problems, f"{'; '.join(problems)} (the ranks: {outcomes})"
