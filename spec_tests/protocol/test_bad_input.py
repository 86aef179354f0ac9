"""Bad input through the protocol interface (P-INPUT-1): a location that is a file, a directory that already
holds a checkpoint, a state dict with a value that cannot be saved. Every rank gets an error, and the location
is left exactly as it was."""

import os

import pytest

from spec_tests.drivers.protocol_saves import (
    BOUND,
    assert_loads,
    committed,
    expected,
    loader,
    rank_state,
    save,
    save_outcome,
    start,
    warm_saver,
)
from spec_tests.drivers.saving import tree
from spec_tests.harness.asserts import HUNG, attempt
from spec_tests.harness.ranks import run_on_ranks, world

pytestmark = pytest.mark.needs("protocol")


def _unsaveable(path):
    """Rank 1's state dict holds a lambda, which no checkpoint format can save (pickle refuses it)."""
    rank, _ = world()
    state = rank_state(rank, 1)
    if rank == 1:
        state["r1"]["hook"] = lambda: None
    saver = warm_saver(path)
    outcome = attempt(lambda: start(saver, state, path).wait(), bound=BOUND, what="start() and wait()")
    attempt(saver.close, bound=BOUND, what="close()")
    return outcome


def _save_first(path):
    save(rank_state(world()[0], 1), path)


def _before(tmp, case):
    path = os.path.join(tmp, "c")
    if case == "file":
        with open(path, "w") as f:
            f.write("not a directory")
    elif case == "checkpoint":
        run_on_ranks(_save_first, 2, (path,), timeout=240)
        assert committed(path, 2), "the first save was not committed"
    return path


def _snapshot(path):
    if os.path.isdir(path):
        return tree(path)
    if os.path.exists(path):
        with open(path, "rb") as f:
            return f.read()
    return None


@pytest.mark.spec("P-INPUT-1")
@pytest.mark.parametrize("case", ["file", "checkpoint", "unsaveable"])
def test_bad_input_fails_on_every_rank_and_leaves_the_location_as_it_was(tmp_path, case):
    path = _before(str(tmp_path), case)
    before = _snapshot(path)
    body = _unsaveable if case == "unsaveable" else save_outcome
    outcomes = run_on_ranks(body, 2, (path,), timeout=240)
    wrong = {r: str(o) for r, o in enumerate(outcomes) if o.returned or o.text == HUNG}
    assert not wrong, f"a save with bad input ({case}) returned or hung on ranks {sorted(wrong)}: {wrong}"
    after = _snapshot(path)
    changed = sorted(set(after or {}) ^ set(before or {})) if isinstance(after, dict) else None
    assert after == before, f"a refused save ({case}) changed the location: {changed or 'its contents'}"
    if case == "checkpoint":
        assert_loads(path, expected(2, 1), call=f"{loader()} of the checkpoint a refused save would have overwritten")
