"""The fault layer sees an fsync made through an open file object, as os.fsync and os.fdatasync accept one
(OLMo-core's writers call `os.fdatasync(tmp_file)`): it is logged like one made through a descriptor."""

from __future__ import annotations

import os

import pytest

from ckptspec.spec.drivers.faults import faultfs


@pytest.mark.parametrize("sync", [os.fsync, os.fdatasync], ids=["fsync", "fdatasync"])
def test_a_sync_through_a_file_object_is_logged(tmp_path, sync):
    root, log = tmp_path / "root", str(tmp_path / "fs.log")
    root.mkdir()
    name = sync.__name__
    with faultfs.installed(faultfs.Plan(root=str(root), log=log)), open(root / "f", "wb") as f:
        f.write(b"x")
        f.flush()
        getattr(os, name)(f)  # the layer's wrapper, looked up at call time
        getattr(os, name)(f.fileno())
    synced = [p.path for p in faultfs.read_log(log) if p.op == "fsync"]
    assert synced == ["f", "f"], faultfs.read_log(log)
