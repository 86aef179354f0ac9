"""The hypothesis profiles of the suite, and which one a run loads.

`ci`: derandomized, 10 examples per property test, the default of every run: without a choice, a run draws the
examples CI draws, on any machine, $CI set or not (a user's `pytest -n auto` is the run CI saw). `explore`:
randomized, as many examples (new ones each run, at CI's cost). `nightly`: randomized, 300 examples, no deadline
(the broad search). Every profile prints the blob that replays a failure (`@reproduce_failure`, docs/hypothesis.md).
Chosen by --hypothesis-profile, else $HYPOTHESIS_PROFILE, else `ci`.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from hypothesis import HealthCheck, settings
from hypothesis.errors import InvalidArgument

__all__ = ["DEFAULT", "PROFILES", "in_ci", "load_profile"]

_SUPPRESS = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
# Every profile derives from hypothesis's own `default`, not from the settings current at import: with $CI set,
# hypothesis loads its built-in `ci` profile (derandomized) at import, and a profile derived from that would make
# `explore` and `nightly` derandomized on any CI machine (the nightly search would draw the same examples every
# night).
_BASE = settings.get_profile("default")
settings.register_profile(
    "ci",
    parent=_BASE,
    derandomize=True,
    database=None,
    max_examples=10,
    stateful_step_count=10,
    deadline=timedelta(seconds=60),
    suppress_health_check=_SUPPRESS,
    print_blob=True,
)
settings.register_profile(
    "explore",
    parent=_BASE,
    max_examples=10,
    stateful_step_count=10,
    deadline=timedelta(seconds=60),
    suppress_health_check=_SUPPRESS,
    print_blob=True,
)
settings.register_profile(
    "nightly",
    parent=_BASE,
    max_examples=300,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=_SUPPRESS,
    print_blob=True,
)
PROFILES = ("ci", "explore", "nightly")
DEFAULT = "ci"


def in_ci() -> bool:
    """Whether $CI asks for CI behaviour: errors for stale expectations (the profile does not depend on it)."""
    return bool(os.environ.get("CI"))


def load_profile(config: pytest.Config) -> str:
    """Load the profile --hypothesis-profile, else $HYPOTHESIS_PROFILE, else DEFAULT (`ci`); return its name."""
    profile = config.getoption("hypothesis_profile", None) or os.environ.get("HYPOTHESIS_PROFILE") or DEFAULT
    try:
        settings.load_profile(profile)
    except InvalidArgument:
        raise pytest.UsageError(
            f"hypothesis profile {profile!r} (from --hypothesis-profile or $HYPOTHESIS_PROFILE) "
            f"is not one of this suite's profiles: {', '.join(PROFILES)}"
        ) from None
    return profile
