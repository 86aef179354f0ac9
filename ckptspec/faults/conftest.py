"""Fault-suite fixtures: the orphan audit around every test (clause FI-ORPHAN-1, cited automatically), and the
S3 endpoint `s3` (ckptspec.spec.harness.s3, the storage suite's)."""

import shutil
import tempfile
from pathlib import Path

import pytest

from ckptspec.faults.audit import Audit
from ckptspec.spec.drivers.faults import tmpdirs
from ckptspec.spec.harness.s3 import s3  # noqa: F401  (the fixture)

_HERE = Path(__file__).resolve().parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    for item in items:
        if _HERE in Path(str(item.path)).resolve().parents:
            item.add_marker(pytest.mark.spec("FI-ORPHAN-1"))


@pytest.fixture(autouse=True)
def orphan_audit():
    """Fail the test if it leaves a process, a shared-memory segment or a temporary file behind.

    The test's private TMPDIR is short (AF_UNIX socket paths, which multiprocessing puts there, are
    limited to 107 bytes) and removed, by its exact path, after the audit.
    """
    tmpdir = tempfile.mkdtemp(prefix="ckptspec-fi-")
    audit = Audit(tmpdir)
    audit.start()
    tmpdirs.current_tmpdir = tmpdir
    try:
        yield
        tmpdirs.current_tmpdir = None
        left = audit.leftovers()
    finally:
        tmpdirs.current_tmpdir = None
        shutil.rmtree(tmpdir, ignore_errors=True)
    if left:
        shown = left[:20] + ([f"... and {len(left) - 20} more"] if len(left) > 20 else [])
        pytest.fail("the test left behind:\n  " + "\n  ".join(shown) + "\n(FI-ORPHAN-1)", pytrace=False)
