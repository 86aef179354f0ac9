"""Parameters of the local manager that shape what it finds: a manager that ignores them fails here."""

import pytest
import torch

from ckptspec.spec.drivers.local import BOUND, find_then_load, module, node_root, save, tasd
from ckptspec.spec.harness.asserts import assert_each_rank, bounded
from ckptspec.spec.harness.ranks import world

pytestmark = pytest.mark.needs("local_checkpointing")


def _sessions(base, saved_in, asked):
    """Save 3 in session `saved_in`; what a manager of session `asked` (same root) finds and loads, then saves 5
    there; what `saved_in` finds afterwards."""
    rank, _ = world()
    lm = module("ckpt_managers.local_manager")
    save(lm.LocalCheckpointManager(node_root(base, rank), session_id=saved_in), tasd({"w": torch.ones(2)}), 3)
    other = lm.LocalCheckpointManager(node_root(base, rank), session_id=asked)
    found = find_then_load(other)
    save(other, tasd({"w": torch.zeros(2)}), 5)
    # The first session must still see its own checkpoint: sessions are kept apart, neither one clears the other.
    own = bounded(
        BOUND, "find_latest()", lm.LocalCheckpointManager(node_root(base, rank), session_id=saved_in).find_latest
    )
    return found.latest, found.part_id, own


@pytest.mark.spec("LM-2P", "LM-2")
@pytest.mark.parametrize(("saved_in", "asked"), [("run-a", "run-b"), ("run-a", ""), ("", "run-b"), ("run-a", "run-a")])
def test_session_id_separates_the_checkpoints_of_one_root(rank_pool, tmp_path, saved_in, asked):
    n = 2
    expected = [(3, (3, rank, asked), 5) if saved_in == asked else (-1, None, 3) for rank in range(n)]
    assert_each_rank(
        "(find_latest, load's part id, the saving session's find_latest)",
        rank_pool(n).run(_sessions, str(tmp_path), saved_in, asked),
        expected,
        per_rank=True,
        call=f"save(3) with session_id={saved_in!r}, then a manager with session_id={asked!r} on the same root",
    )
