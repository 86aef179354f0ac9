"""A coverage.py plugin that labels what each line of impl ran for with the pytest test that was running.

Used by `mutation.coverage_map` only (named in its rcfile's `[run] plugins`). In the pytest process a test's
context starts at `_pytest.runner.call_and_report` (setup, call and teardown of one item), whose node id is also
written to $CKPTSPEC_MUT_CONTEXT. Every other process (forked ranks, impl's writer processes) and every
background thread cannot see pytest, so they take the node id from that file when a rank starts a body
(`_serve`) or when impl code is entered outside any context. A persistent worker is therefore labelled with the
test that was running when it started: the map is a heuristic that orders and narrows the tests run per mutant,
never the judge of a survivor (see mutation.run).
"""

from __future__ import annotations

import os
from pathlib import Path

import coverage

CONTEXT_FILE = "CKPTSPEC_MUT_CONTEXT"  # names the file that holds the running test's node id
IMPL_DIR = os.path.join(os.environ.get("CKPTSPEC_MUT_TREE", os.getcwd()), "ckptspec", "impl") + os.sep


def _current() -> str | None:
    try:
        return Path(os.environ[CONTEXT_FILE]).read_text() or None
    except (KeyError, OSError):
        return None


class TestContexts(coverage.CoveragePlugin):
    def dynamic_context(self, frame) -> str | None:
        code = frame.f_code
        if code.co_name == "call_and_report" and "item" in frame.f_locals:
            nodeid = frame.f_locals["item"].nodeid
            worker = os.environ.get("PYTEST_XDIST_WORKER")
            if worker and not os.environ[CONTEXT_FILE].endswith(f".{worker}"):
                # One file per xdist worker; what this worker starts from now on (its ranks) inherits it.
                os.environ[CONTEXT_FILE] += f".{worker}"
            path = Path(os.environ[CONTEXT_FILE])
            tmp = path.with_name(f"{path.name}.{os.getpid()}")
            tmp.write_text(nodeid)
            tmp.replace(path)  # atomically: a process reading it never sees it empty
            return nodeid
        if code.co_name == "_serve" or code.co_filename.startswith(IMPL_DIR):
            return _current()
        return None


def coverage_init(reg, options) -> None:
    reg.add_dynamic_context(TestContexts())
