"""The orphan audit charges a test only with the /dev/shm entries its own processes made (ckptspec/faults/shm_watch.py).

A folder of the test's own stands in for /dev/shm: the entries are named as torch and the CUDA driver name theirs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ckptspec.faults import audit
from ckptspec.faults.shm_watch import ShmWatch, creator_pid

MAKE_AND_WAIT = (
    "import os, sys; open(os.path.join(sys.argv[1], f'torch_{os.getpid()}_77_0'), 'w').close(); "
    "print('made', flush=True); sys.stdin.read()"
)


@pytest.mark.parametrize(
    ("name", "pid"),
    [
        ("torch_4260_3128563826_1", 4260),
        ("cuda.shm.0.10a4.1", 0x10A4),
        ("cuda.shm.1.aad.12", 0xAAD),
        ("sem.mp-4260-1", None),
        ("psm_6b1f", None),
        ("torch_shm_manager", None),
    ],
)
def test_the_maker_is_read_from_torch_and_cuda_names(name: str, pid: int | None) -> None:
    assert creator_pid(name) == pid


def _make_in_child(folder: Path) -> subprocess.Popen[str]:
    child = subprocess.Popen(
        [sys.executable, "-c", MAKE_AND_WAIT, str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "made"
    return child


def test_entries_of_processes_outside_the_tree_are_foreign_and_the_trees_own_are_not(tmp_path: Path) -> None:
    watch = ShmWatch(str(tmp_path))
    (tmp_path / "torch_1_0_0").touch()  # there before the test: never new
    watch.start({p.name for p in tmp_path.iterdir()})
    try:
        outside = f"cuda.shm.0.{os.getppid():x}.1"  # the parent is alive and not below this process
        (tmp_path / outside).touch()
        child = _make_in_child(tmp_path)
        watch.look()
        child.communicate("", timeout=60)
        (tmp_path / "unnamed-entry").touch()
    finally:
        watch.stop()
    assert watch.foreign() == {outside}


def test_the_audit_charges_the_tests_entries_and_not_other_programs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(audit, "_SHM", str(shm))
    check = audit.Audit(tmpdir=None, grace=0.2)
    check.start()
    (shm / f"torch_{os.getppid()}_5_0").touch()
    child = _make_in_child(shm)
    made_by_child = f"torch_{child.pid}_77_0"
    check._shm_watch.look()
    child.communicate("", timeout=60)
    found = check.leftovers()
    assert len(found) == 1, found
    assert found[0].startswith(f"shared memory {shm}/{made_by_child} (made by pid {child.pid}: "), found


def test_entries_named_after_the_harnesss_long_lived_processes_are_not_the_tests(tmp_path: Path) -> None:
    """The CUDA IPC test on the H100 runs left `cuda.shm.0.<the rank forkserver's pid>.1`: a process of the test's tree,
    but the harness's (as audit.harness_pids names them), so the audit does not charge it to the target."""
    child = _make_in_child(tmp_path)  # stands in for the forkserver: alive, below this process
    try:
        watch = ShmWatch(str(tmp_path), harness=lambda: {child.pid})
        watch.start({p.name for p in tmp_path.iterdir()})
        try:
            named_after_it = f"cuda.shm.0.{child.pid:x}.1"
            (tmp_path / named_after_it).touch()
            watch.look()
        finally:
            watch.stop()
    finally:
        child.communicate("", timeout=60)
    assert watch.foreign() == {named_after_it}
    assert watch.maker(named_after_it) is None


def test_the_audit_asks_which_processes_are_the_harnesss(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(audit, "_SHM", str(shm))
    child = _make_in_child(shm)  # its own torch_<pid>_77_0 is there before the audit starts
    try:
        monkeypatch.setattr(audit, "harness_pids", lambda: {child.pid})
        check = audit.Audit(tmpdir=None, grace=0.2)
        check.start()
        (shm / f"cuda.shm.0.{child.pid:x}.1").touch()
        check._shm_watch.look()
        found = check.leftovers()
    finally:
        child.communicate("", timeout=60)
    assert found == [], found
