"""Running a hypothesis state machine as a test, the way every machine of the suite is run.

A machine is a RuleBasedStateMachine whose constructor takes what it drives (a rank pool, a directory):

    run_machine(request, lambda: QueueMachine(rank_pool(2), persistent, str(tmp_path)))

Rules say what they did with hypothesis's `note(...)`, so that a failing run prints the steps with their effects.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

import pytest
from hypothesis import Phase, settings
from hypothesis.stateful import RuleBasedStateMachine, run_state_machine_as_test

__all__ = ["agreed", "run_machine"]

T = TypeVar("T")

EXAMPLE_SHARE = 3
"""A machine's examples are long (each starts queues or ranks): it runs 1/EXAMPLE_SHARE of the profile's examples."""


def run_machine(request: pytest.FixtureRequest, build: Callable[[], RuleBasedStateMachine]) -> None:
    """Run the machine that build() makes, with the profile's settings but fewer, longer examples.

    A test expected to fail (an xfail from the target's expectations) is not shrunk: a known divergence is not
    worth minutes of shrinking.
    """
    __tracebackhide__ = True
    phases = [Phase.explicit, Phase.reuse, Phase.generate]
    if not request.node.get_closest_marker("xfail"):
        phases.append(Phase.shrink)
    budget = settings(phases=phases, max_examples=max(3, settings().max_examples // EXAMPLE_SHARE))
    # hypothesis annotates type[RuleBasedStateMachine], but documents (and calls) any no-argument factory.
    run_state_machine_as_test(build, settings=budget)  # type: ignore[arg-type]


def agreed(what: str, results: Sequence[T]) -> T:
    """The one result every rank gave for `what`; fails naming each rank's result when they differ."""
    __tracebackhide__ = True
    assert all(r == results[0] for r in results), (
        f"{what}: " + ", ".join(f"rank {rank}={r!r}" for rank, r in enumerate(results)) + ", but ranks should agree"
    )
    return results[0]
