"""The hypothesis profiles (spec_tests.harness.profiles) are what their docstring says whatever the environment:
`ci` derandomized, `dev` and `nightly` randomized, also where $CI makes hypothesis load its own `ci` profile."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import settings

from spec_tests.harness import profiles


@pytest.fixture
def reloaded_under_a_derandomized_default():
    """The profiles registered again while a derandomized profile is loaded (what hypothesis does at import when
    $CI is set); the loaded profile and the registrations restored after."""
    loaded = settings.default
    settings.register_profile("ckptspec-derandomized-default", derandomize=True, database=None)
    settings.load_profile("ckptspec-derandomized-default")
    try:
        yield importlib.reload(profiles)
    finally:
        settings.register_profile("ckptspec-restored", loaded)
        settings.load_profile("ckptspec-restored")
        importlib.reload(profiles)


def test_each_profile_is_as_documented_whatever_was_loaded_before(reloaded_under_a_derandomized_default):
    modes = {name: settings.get_profile(name).derandomize for name in reloaded_under_a_derandomized_default.PROFILES}
    assert modes == {"ci": True, "dev": False, "nightly": False}
    assert settings.get_profile("nightly").max_examples == 300
    assert settings.get_profile("ci").database is None
