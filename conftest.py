"""Root conftest: loads the spec plugin so spec_tests, fault_injection and benchmarks share it."""

pytest_plugins = ("spec_tests.harness.plugin",)
