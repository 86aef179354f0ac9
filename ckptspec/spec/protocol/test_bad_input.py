"""Bad input through the protocol interface (P-INPUT-1): a location that is a file, a directory that already
holds a checkpoint, a state dict with a value that cannot be saved. Every rank gets an error, and the location
is left exactly as it was. At the weak level (P-INPUT-1w) the ranks agree, and nothing is left half-done: an
existing checkpoint loads as it was or as the new save, and a save that failed commits nothing."""

import os

import pytest
from torch.distributed.checkpoint import CheckpointException  # a BaseException, not an Exception

from ckptspec.spec.drivers.protocol_saves import (
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
from ckptspec.spec.drivers.saving import tree
from ckptspec.spec.harness.asserts import HUNG, attempt
from ckptspec.spec.harness.ranks import run_on_ranks, world

pytestmark = pytest.mark.needs("protocol")


def _unsaveable(path, version: int = 1):
    """Rank 1's state dict holds a lambda, which no checkpoint format can save (pickle refuses it)."""
    rank, _ = world()
    state = rank_state(rank, version)
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


def _whole(path: str, case: str, returned: bool) -> str | None:
    """What P-INPUT-1w finds wrong with the location after a bad-input save of checkpoint 2 that every rank agreed on."""
    if case == "checkpoint":
        problems = []
        for version in (1, 2):  # as it was, or overwritten whole by the new save
            try:
                assert_loads(path, expected(2, version))
                return None
            except (Exception, CheckpointException) as exc:  # any failure to load is what the clause judges
                problems.append(f"as checkpoint {version}: {type(exc).__name__}: {exc}")
        return f"the checkpoint at the location loads neither as it was nor as the new save ({'; '.join(problems)})"
    if returned:
        return f"a save with bad input ({case}) reported success on every rank"
    return f"a save that failed ({case}) left a committed checkpoint" if committed(path, 2) else None


@pytest.mark.spec("P-INPUT-1w")
@pytest.mark.parametrize("case", ["file", "checkpoint", "unsaveable"])
def test_bad_input_leaves_the_ranks_agreeing_and_nothing_half_done(tmp_path, case):
    path = _before(str(tmp_path), case)
    body = _unsaveable if case == "unsaveable" else save_outcome
    outcomes = run_on_ranks(body, 2, (path, 2), timeout=240)
    hung = [r for r, o in enumerate(outcomes) if o.text == HUNG]
    assert not hung, f"a save with bad input ({case}) hung on ranks {hung}: {[str(o) for o in outcomes]}"
    said = {r: "returned" if o.returned else "raised" for r, o in enumerate(outcomes)}
    assert len(set(said.values())) == 1, f"the ranks disagree on a save with bad input ({case}): {said}"
    problem = _whole(path, case, outcomes[0].returned)
    assert problem is None, problem
