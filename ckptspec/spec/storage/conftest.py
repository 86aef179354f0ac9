"""Fixtures of the storage tests: the S3 endpoint (ckptspec.spec.harness.s3) and its fault proxy."""

import pytest

from ckptspec.spec.harness.s3 import s3  # noqa: F401  (the fixture, shared with the fault suite)


@pytest.fixture
def proxy(s3):  # noqa: F811
    """The fault proxy of the S3 endpoint, healed again after the test."""
    yield s3.proxy
    s3.proxy.heal()
