"""The forkserver's preload probe (ckptspec/spec/harness/ranks/fork_safety.py) answers what a forked child can do."""

from __future__ import annotations

import torch

from ckptspec.spec.harness.ranks.fork_safety import cuda_survives_fork, forked_child_can_use


def test_a_child_forked_after_the_imports_computes_on_the_cpu() -> None:
    assert forked_child_can_use("cpu", ("ckptspec.spec.targets.impl", "ckptspec.impl.async_ckpt.core"))


def test_a_failing_import_answers_no() -> None:
    assert not forked_child_can_use("cpu", ("ckptspec.spec.no_such_module",))


def test_without_a_gpu_the_answer_costs_nothing_and_is_yes() -> None:
    if torch.cuda.device_count() == 0:
        assert cuda_survives_fork(("ckptspec.spec.no_such_module",)), "without a GPU there is nothing to break"
    else:
        assert cuda_survives_fork(("ckptspec.spec.targets.impl", "ckptspec.impl.async_ckpt.core"))
