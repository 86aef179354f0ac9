"""The pointer naming the latest checkpoint comes last and durable (MG-PTR-1, weak level MG-PTR-1w), and a storage
error publishing it is loud on every rank and leaves the previous pointer valid (MG-PTR-2, weak level MG-PTR-2w).

A manager without a pointer (`CheckpointManager.pointer` is None: resume scans the checkpoints) is not judged here
(skip). The order is read on a trace of the save's file-system calls (ckptspec.spec.drivers.faults.faultfs), as P-DURABLE-1 reads
a protocol save's: the pointer's commit is the rename onto it; the errors are injected on the pointer's writes and
renames, on every rank, so they reach whichever rank publishes it.
"""

from __future__ import annotations

import errno
import os

import pytest

from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.drivers.faults.crash_points import in_child
from ckptspec.spec.drivers.manager_saves import BOUND, assert_step, managed, resumed, save_steps, step_state
from ckptspec.spec.harness.asserts import HUNG, attempt
from ckptspec.spec.harness.ranks import world

pytestmark = pytest.mark.needs("manager", "manager_pointer")


def _traced(root: str, log: str):
    """Commit step 1, then save step 2 under the tracing layer; the pointer's path relative to root, or None."""
    with managed(root) as manager:
        save_steps(manager, [1])
        if manager.pointer is None:
            return None
        with faultfs.installed(faultfs.Plan(root=root, log=log)):
            save_steps(manager, [2])
        return os.path.relpath(manager.pointer, root), os.path.relpath(manager.location(2), root)


def _trace(tmp: str):
    root, log = os.path.join(tmp, "ckpt"), os.path.join(tmp, "trace.log")
    kind, result = in_child(tmp, "trace", _traced, root, log)
    assert kind == "ok", f"the traced save failed: {result}"
    if result is None:
        pytest.skip("this manager publishes no pointer: resume scans the checkpoints")
    pointer, location = result
    points = faultfs.read_log(log)
    commits = [p for p in points if p.op == "rename" and p.path.endswith("->" + pointer)]
    if not commits:
        pytest.skip(f"the injected layer saw no rename onto the pointer {pointer}: its publication cannot be judged")
    return points, commits[-1], pointer, location


def _below(path: str, location: str) -> bool:
    return path == location or path.startswith(location + os.sep)


def _unordered(points, commit, location: str) -> list[str]:
    """MG-PTR-1w: writes and renames of the checkpoint's files that come after the pointer's commit."""
    late = [p for p in points if p.index > commit.index and p.op in ("write", "rename", "open")]
    return [
        f"{p.op} {p.path} (point {p.index}) after the pointer's rename (point {commit.index})"
        for p in late
        if _below(p.path.split("->")[-1], location)
    ]


@pytest.mark.spec("MG-PTR-1")
def test_the_pointer_is_published_last_and_durable(tmp_path):
    points, commit, pointer, location = _trace(str(tmp_path))
    problems = _unordered(points, commit, location)
    for name in sorted({p.path.split("->")[-1] for p in points if p.op == "write" and _below(p.path, location)}):
        last = max(p.index for p in points if p.op == "write" and p.path.split("->")[-1] == name)
        renamed = [p.path.split("->")[0] for p in points if p.op == "rename" and p.path.endswith("->" + name)]
        names = {name, *renamed}
        if not any(p.op == "fsync" and p.path in names and last < p.index < commit.index for p in points):
            problems.append(f"{name} was not fsynced between its last write (point {last}) and the pointer's rename")
    source = commit.path.split("->")[0]
    if not any(p.op == "fsync" and p.path == source and p.index < commit.index for p in points):
        problems.append(f"the pointer's temporary file {source} was not fsynced before its rename onto {pointer}")
    folder = os.path.dirname(pointer) or "."
    if not any(p.op == "fsync" and p.path == folder and p.index > commit.index for p in points):
        problems.append(f"the directory {folder} holding the pointer was not fsynced after its rename")
    assert not problems, "\n".join(problems)


@pytest.mark.spec("MG-PTR-1w")
def test_the_pointer_never_names_a_checkpoint_still_being_written(tmp_path):
    points, commit, _, location = _trace(str(tmp_path))
    problems = _unordered(points, commit, location)
    assert not problems, "\n".join(problems)


def _pointer_fails(root: str, code: int, log: str):
    rank, _ = world()
    with managed(root, failed=True) as manager:
        save_steps(manager, [1])
        if manager.pointer is None:
            return None
        name = os.path.basename(manager.pointer)
        faults = (
            faultfs.Fault("raise", errno=code, op="write", name=name + "*"),
            faultfs.Fault("raise", errno=code, op="rename", name="*->" + name),
        )
        with faultfs.installed(faultfs.Plan(root=os.path.dirname(manager.pointer), log=f"{log}.{rank}", faults=faults)):
            return attempt(lambda: (manager.save(2, step_state(2, rank)), manager.wait()), bound=BOUND, what="save(2)")


def _pointer_error(rank_pool, tmp: str, code: int):
    root, log = os.path.join(tmp, "ckpt"), os.path.join(tmp, "faultfs.log")
    outcomes = rank_pool(2).run(_pointer_fails, root, code, log)
    if outcomes[0] is None:
        pytest.skip("this manager publishes no pointer: resume scans the checkpoints")
    if not any(os.path.exists(f"{log}.{r}") and faultfs.fired(f"{log}.{r}", "raise") for r in range(2)):
        pytest.skip("the injected layer saw no write or rename of the pointer: no publication failed")
    kind, result = in_child(tmp, "resume", resumed, root, 2)
    assert kind == "ok", f"resume: {result}"
    return outcomes, result


CODES = {"ENOSPC": errno.ENOSPC, "EDQUOT": errno.EDQUOT, "EIO": errno.EIO}


@pytest.mark.spec("MG-PTR-2")
@pytest.mark.parametrize("code", CODES)
def test_a_failed_pointer_write_raises_on_every_rank_and_keeps_the_previous_pointer(rank_pool, tmp_path, code):
    outcomes, result = _pointer_error(rank_pool, str(tmp_path), CODES[code])
    quiet = {r: str(o) for r, o in enumerate(outcomes) if o.returned or o.text == HUNG}
    assert not quiet, f"{code} publishing the pointer of step 2, but save(2)+wait() on ranks {sorted(quiet)}: {quiet}"
    assert_step(result, 1, 2, what=f"resume() after {code} publishing the pointer of step 2")


@pytest.mark.spec("MG-PTR-2w")
@pytest.mark.parametrize("code", CODES)
def test_a_failed_pointer_write_is_raised_and_keeps_the_previous_pointer(rank_pool, tmp_path, code):
    outcomes, result = _pointer_error(rank_pool, str(tmp_path), CODES[code])
    assert any(not o.returned and o.text != HUNG for o in outcomes), (
        f"{code} publishing the pointer of step 2, but no rank raised: {[str(o) for o in outcomes]}"
    )
    assert_step(result, 1, 2, what=f"resume() after {code} publishing the pointer of step 2")
