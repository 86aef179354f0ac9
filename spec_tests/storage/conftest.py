"""Fixtures of the storage tests: the S3 endpoint (moto on loopback, with a fault proxy) and its MSC config."""

import pytest

from spec_tests.harness.s3 import start_endpoint


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """A running S3 endpoint for the module; ranks get its MSC config file (`s3.config_path`) as MSC_CONFIG."""
    endpoint, stop = start_endpoint(str(tmp_path_factory.mktemp("msc") / "msc_config.yaml"))
    yield endpoint
    stop()


@pytest.fixture
def proxy(s3):
    """The fault proxy of the S3 endpoint, healed again after the test."""
    yield s3.proxy
    s3.proxy.heal()
