"""Parameters that shape the checkpoint: a writer that ignores them, or uses their defaults, fails here."""

import os
import uuid

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from ckptspec.spec.drivers import saving
from ckptspec.spec.harness.asserts import assert_equal
from ckptspec.spec.harness.processes import remove

pytestmark = pytest.mark.needs("storage_writer")


def _data_files(tmp, state_dict, thread_count, hint):
    """Save on one rank; the data files of the checkpoint, grouped by their name's prefix before `__`."""
    path = os.path.join(tmp, uuid.uuid4().hex)
    saving.async_save(state_dict, path, persistent=None, thread_count=thread_count, separation_hint=hint)
    groups: dict[str, int] = {}
    for name in os.listdir(path):
        if name.endswith(".distcp"):
            prefix = name.split("__", 1)[0]
            groups[prefix] = groups.get(prefix, 0) + 1
    remove(path)
    return groups


@pytest.mark.spec("FS-5P")
@given(thread_count=st.integers(1, 4), extra=st.integers(0, 3), sizes=st.randoms(use_true_random=False))
def test_thread_count_sets_the_number_of_files(rank_pool, tmp_path_factory, thread_count, extra, sizes):
    n = thread_count + extra
    state_dict = {f"t{i}": torch.arange(float(sizes.randint(1, 64))) for i in range(n)}
    groups = rank_pool(1).run(_data_files, str(tmp_path_factory.mktemp("threads")), state_dict, thread_count, None)[0]
    assert_equal(f"data files per prefix for {n} tensors, thread_count={thread_count}", groups, {"": thread_count})


@pytest.mark.spec("FS-5P", "FS-6")
@given(half=st.integers(1, 2), extra=st.integers(0, 2))
def test_separation_hint_splits_the_threads_between_the_groups(rank_pool, tmp_path_factory, half, extra):
    n = half + extra
    state_dict = {f"opt{i}": torch.ones(8 + i) for i in range(n)} | {f"w{i}": torch.ones(4 + i) for i in range(n)}
    groups = rank_pool(1).run(_data_files, str(tmp_path_factory.mktemp("hint")), state_dict, 2 * half, "opt")[0]
    assert_equal(
        f"data files per prefix for {n} + {n} tensors, thread_count={2 * half}, separation_hint='opt'",
        groups,
        {"": half, "opt": half},
    )
