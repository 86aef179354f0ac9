"""A pytest plugin for the meta tests: each process that collects writes what it collected, then runs nothing.

Loaded with `-p harness_tests.collect_probe` and $CKPTSPEC_COLLECT_PROBE=DIR. The main process, or
each xdist worker (the controller collects nothing), writes DIR/<"main" or worker id>.txt: the node ids left
after deselection (-k), one a line. Then it deselects them all. Unlike --collect-only, which turns xdist off,
this lets `-n 2` forms collect in their workers, where a late marker or option registration shows up.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ENV_VAR = "CKPTSPEC_COLLECT_PROBE"


@pytest.hookimpl(trylast=True)  # after -k deselection and the spec plugin's checks
def pytest_collection_modifyitems(config, items):
    out = os.environ.get(ENV_VAR)
    if not out:
        return
    name = config.workerinput["workerid"] if hasattr(config, "workerinput") else "main"
    Path(out, f"{name}.txt").write_text("".join(f"{item.nodeid}\n" for item in items))
    config.hook.pytest_deselected(items=list(items))
    items[:] = []
