"""The hypothesis profiles (ckptspec.spec.harness.profiles) are what their docstring says whatever the environment:
`ci` derandomized, `explore` and `nightly` randomized, also where $CI makes hypothesis load its own `ci` profile;
and a run that chooses none loads `ci`, $CI set or not, so that a user's run draws the examples CI's drew."""

from __future__ import annotations

import importlib
from typing import cast

import pytest
from hypothesis import settings

from ckptspec.spec.harness import profiles


@pytest.fixture
def restored_profile():
    """The hypothesis settings loaded now, loaded again after the test."""
    loaded = settings.default
    try:
        yield
    finally:
        settings.register_profile("ckptspec-restored", loaded)
        settings.load_profile("ckptspec-restored")


@pytest.fixture
def reloaded_under_a_derandomized_default(restored_profile):
    """The profiles registered again while a derandomized profile is loaded (what hypothesis does at import when
    $CI is set); the loaded profile and the registrations restored after."""
    settings.register_profile("ckptspec-derandomized-default", derandomize=True, database=None)
    settings.load_profile("ckptspec-derandomized-default")
    try:
        yield importlib.reload(profiles)
    finally:
        importlib.reload(profiles)


def test_each_profile_is_as_documented_whatever_was_loaded_before(reloaded_under_a_derandomized_default):
    modes = {name: settings.get_profile(name).derandomize for name in reloaded_under_a_derandomized_default.PROFILES}
    assert modes == {"ci": True, "explore": False, "nightly": False}
    assert settings.get_profile("explore").max_examples == settings.get_profile("ci").max_examples
    assert settings.get_profile("nightly").max_examples == 300
    assert settings.get_profile("ci").database is None
    blobs = {name: settings.get_profile(name).print_blob for name in profiles.PROFILES}
    assert blobs == dict.fromkeys(profiles.PROFILES, True), "every profile prints the blob that replays a failure"


class _Options:
    """The one thing load_profile reads of a pytest.Config: --hypothesis-profile."""

    def __init__(self, hypothesis_profile: str | None):
        self.hypothesis_profile = hypothesis_profile

    def getoption(self, name: str, default: object = None) -> object:
        return self.hypothesis_profile if name == "hypothesis_profile" else default


def _config(hypothesis_profile: str | None = None) -> pytest.Config:
    return cast(pytest.Config, _Options(hypothesis_profile))


@pytest.mark.parametrize("ci", [None, "true"], ids=["CI-unset", "CI-set"])
def test_a_run_that_chooses_no_profile_draws_what_ci_draws(monkeypatch, restored_profile, ci):
    monkeypatch.delenv("HYPOTHESIS_PROFILE", raising=False)
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    assert profiles.load_profile(_config()) == "ci"
    assert settings().derandomize, "the profile loaded without a choice draws at random"


def test_the_option_comes_before_the_environment(monkeypatch, restored_profile):
    monkeypatch.setenv("HYPOTHESIS_PROFILE", "nightly")
    assert profiles.load_profile(_config()) == "nightly"
    assert profiles.load_profile(_config("explore")) == "explore"
    assert not settings().derandomize
