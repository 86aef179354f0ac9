"""Root conftest: what pytest must know before it collects any directory, whichever way the suite is started
from a checkout.

- The spec plugin (`ckptspec.spec.harness.plugin`; also loaded by `-p` in pyproject.toml's addopts, so this line
  matters only for a run with another ini file).
- The benchmark suite's command-line options and default JSON path (`ckptspec.bench.options`; an installed copy loads
  it by `-p` in ckptspec/spec/harness/installed.toml).

Markers are declared in pyproject.toml (`markers`) or by the spec plugin, never in a sub-directory's conftest.
"""

pytest_plugins = ("ckptspec.spec.harness.plugin", "ckptspec.bench.options")
