"""The forkserver's preload probe (spec_tests/harness/ranks/fork_safety.py) answers what a forked child can do."""

from __future__ import annotations

import torch

from spec_tests.harness.ranks.fork_safety import cuda_survives_fork, forked_child_can_use


def test_a_child_forked_after_the_imports_computes_on_the_cpu() -> None:
    assert forked_child_can_use("cpu", ("spec_tests.targets.impl", "impl.async_ckpt.core"))


def test_a_failing_import_answers_no() -> None:
    assert not forked_child_can_use("cpu", ("spec_tests.no_such_module",))


def test_without_a_gpu_the_answer_costs_nothing_and_is_yes() -> None:
    if torch.cuda.device_count() == 0:
        assert cuda_survives_fork(("spec_tests.no_such_module",)), "without a GPU there is nothing to break"
    else:
        assert cuda_survives_fork(("spec_tests.targets.impl", "impl.async_ckpt.core"))
