"""The fault matrix for targets judged through the protocol interface only (torch DCP's async_save: dcp-thread,
dcp-process, dcp-staged): the same faults in the same phases as the other modules of this suite, which drive the
AsyncCallsQueue API that these targets lack (targets that have it are judged there and skip here).

The FI clauses read in protocol terms (ckptspec.spec.harness.surface.saver_api): "the save raises CheckpointException on every
rank" is "start() or wait() raises on every rank", "the same queue" is "the same saver", "close(abort=True)" is
"abort() of the save in flight". A fault is placed in a phase by the file operation it hits, in the trainer and
every thread and forked process of its save (ckptspec.spec.drivers.faults.faultfs): plan is the mkdir of the checkpoint
directory, write a data file (`*.distcp`), finalize the coordinator's `.metadata`. A saver that writes from a
spawned process (dcp-process's checkpoint daemon) is out of the layer's reach: where no fault fired, the test
skips saying so instead of judging a fault that never happened. Damage after commit needs no layer: the files of
a committed checkpoint are changed at rest and loaded with stock `torch.distributed.checkpoint.load`.

File names are the target's format's (ckptspec.spec.harness.surface.formats): DCP's `*.distcp` and `.metadata` stand for the
format's data files and commit marker; a format without a marker has no finalize phase (its cells are skipped,
saying so), and a writer that writes elsewhere and moves its files in gives the layer no write to act on.
"""

from __future__ import annotations

import fnmatch
import os
import signal
import time
from typing import Any

import pytest
import torch.distributed as dist

from ckptspec.faults.faults import ERRNOS, STORAGE_FAULTS
from ckptspec.spec.drivers.bounds import BOUND, EXIT_BOUND
from ckptspec.spec.drivers.damage import Damage, apply, files_under
from ckptspec.spec.drivers.faults import faultfs
from ckptspec.spec.drivers.faults.crash_points import in_child
from ckptspec.spec.drivers.faults.tmpdirs import on_ranks
from ckptspec.spec.drivers.protocol_saves import (
    WARM_BOUND,
    assert_loads,
    committed,
    expected,
    loader,
    rank_state,
    save,
    start,
)
from ckptspec.spec.harness import HUNG, attempt, remove, wait_for_file, world
from ckptspec.spec.harness.shared_runs import shared
from ckptspec.spec.harness.surface.loading import checkpoint_format
from ckptspec.spec.harness.surface.saver_api import protocol_saver

pytestmark = pytest.mark.needs("protocol")
WORLD = 2
NOT_REACHED = (
    "the fault layer saw no matching file operation: this target writes from a process it cannot reach, or "
    "writes its files elsewhere and moves them in"
)
NO_MARKER = "this target's format has no commit marker: a fault in the finalize phase has nothing to hit"


def _in_format(where: dict[str, Any]) -> dict[str, Any]:
    """A fault's placement with DCP's names translated into the target's format; skips where it has no marker."""
    fmt, name = checkpoint_format(), where.get("name")
    if name == "*.distcp":
        return {**where, "name": fmt.data_glob}
    if name == ".metadata*":
        if fmt.marker is None:
            pytest.skip(NO_MARKER)
        return {**where, "name": fmt.marker + "*"}
    return where


@pytest.fixture(autouse=True)
def _protocol_only(target):
    if target.has("persistent_caller"):
        pytest.skip(f"target {target.name!r} has an AsyncCallsQueue: the other modules of ckptspec/faults judge it")


def _plan(path: str, log: str, *faults: faultfs.Fault) -> faultfs.Plan:
    return faultfs.Plan(root=path, log=log, faults=faults)


def _write(path: str, text: str) -> None:
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


def _first_save(tmp: str):
    """A new saver that saved checkpoint 0 to tmp/old (its workers started, as a trainer's are)."""
    saver = protocol_saver()
    save(rank_state(world()[0], 0), os.path.join(tmp, "old"), saver, bound=WARM_BOUND)
    return saver


def _whole_save(saver, path: str, version: int, what: str):
    rank = world()[0]
    return attempt(lambda: start(saver, rank_state(rank, version), path).wait(), bound=BOUND, what=what)


# ----------------------------------------------------------------------------------------- storage errors


def _storage_errors(tmp: str, phase: str) -> dict:
    """Per errno: (the faulty save's outcome, whether the layer fired here, the next save's outcome)."""
    rank, _ = world()
    saver = _first_save(tmp)
    results = {}
    for version, errno_name in enumerate(ERRNOS, start=1):
        new, log = os.path.join(tmp, f"new-{errno_name}"), os.path.join(tmp, f"fs-{errno_name}-{rank}.log")
        hit, where = STORAGE_FAULTS[phase, errno_name]
        fault = faultfs.Fault("raise", errno=faultfs.errno_of(errno_name), **_in_format(where))
        with faultfs.installed(_plan(new, log, fault) if hit in ("all", rank) else None):
            outcome = _whole_save(saver, new, version, f"a save hitting {errno_name} in {phase}").text
        fired = bool(os.path.exists(log) and faultfs.fired(log, "raise"))
        if outcome == HUNG:
            results[errno_name] = (outcome, fired, "not tried")
            return results
        after = _whole_save(saver, os.path.join(tmp, f"after-{errno_name}"), 10 + version, "the next save").text
        results[errno_name] = (outcome, fired, after)
        if after == HUNG:
            return results
    attempt(saver.close, bound=BOUND, what="close()")
    return results


def _storage_errors_run(tmp_path_factory, phase: str) -> tuple[str, list]:
    """The run of `_storage_errors` in `phase` (its directory, each rank's result), made once per session for
    FI-STORAGE-1/2 and FI-STORAGE-2w; skips a phase the format does not have, or where no fault fired."""
    _in_format(STORAGE_FAULTS[phase, ERRNOS[0]][1])

    def make():
        tmp = str(tmp_path_factory.mktemp(f"storage-errors-{phase}"))
        return tmp, on_ranks(WORLD, _storage_errors, tmp, phase, timeout=200)

    tmp, results = shared(tmp_path_factory, f"storage-errors-{phase}", make)
    if not any(r[e][1] for r in results for e in r):
        pytest.skip(NOT_REACHED)
    return tmp, results


@pytest.mark.spec("FI-STORAGE-1", "FI-STORAGE-2")
@pytest.mark.parametrize("phase", ["plan", "write", "finalize"])
def test_storage_error_fails_the_save_on_every_rank(tmp_path_factory, phase):
    tmp, results = _storage_errors_run(tmp_path_factory, phase)
    problems = []
    for version, errno_name in enumerate(ERRNOS, start=1):
        if not all(errno_name in r for r in results):
            problems.append(f"{errno_name}: not tried (a rank hung before)")
            continue
        if not any(r[errno_name][1] for r in results):
            continue  # the fault took on no rank (the writes it is placed on go around the layer): nothing to judge
        outcomes = [r[errno_name][0] for r in results]
        if any(o in ("returned", HUNG) for o in outcomes):
            problems.append(f"{errno_name} in {phase}: outcome per rank {outcomes}, but every rank should raise")
        problems += _committed(tmp, errno_name, phase)
        after = [r[errno_name][2] for r in results]
        if after != ["returned"] * WORLD:
            problems.append(f"{errno_name} in {phase}: the next save with the same saver: {after}")
        else:
            assert_loads(os.path.join(tmp, f"after-{errno_name}"), expected(WORLD, 10 + version))
    assert_loads(os.path.join(tmp, "old"), expected(WORLD, 0))
    assert not problems, "\n".join(problems)


def _committed(tmp: str, errno_name: str, phase: str) -> list[str]:
    if not committed(os.path.join(tmp, f"new-{errno_name}"), WORLD):
        return []
    marker = checkpoint_format().marker
    return [f"{errno_name} in {phase}: the failed save " + (f"wrote {marker}" if marker else "was committed")]


@pytest.mark.spec("FI-STORAGE-2w")
@pytest.mark.parametrize("phase", ["plan", "write", "finalize"])
def test_storage_error_never_passes_for_saved_later(tmp_path_factory, phase):
    tmp, results = _storage_errors_run(tmp_path_factory, phase)
    problems = []
    for version, errno_name in enumerate(ERRNOS, start=1):
        if not all(errno_name in r for r in results):
            problems.append(f"{errno_name}: not tried (a save hung before, and the saver with it)")
            continue
        failed = os.path.join(tmp, f"new-{errno_name}")
        if committed(failed, WORLD):  # whole or not at all: a failed save committed whole loses nothing
            assert_loads(failed, expected(WORLD, version), call=f"loading the save that failed with {errno_name}")
        after, path = [r[errno_name][2] for r in results], os.path.join(tmp, f"after-{errno_name}")
        if HUNG in after or "not tried" in after:
            problems.append(f"{errno_name} in {phase}: the saver hung; the next save per rank: {after}")
        elif "returned" in after and committed(path, WORLD):
            assert_loads(path, expected(WORLD, 10 + version))
        elif "returned" in after:
            problems.append(f"{errno_name} in {phase}: the next save per rank {after}, but nothing was committed")
    assert_loads(os.path.join(tmp, "old"), expected(WORLD, 0))
    assert not problems, "\n".join(problems)


# ------------------------------------------------------------------------------------------ killed rank

KILLS: dict[str, tuple[int, dict[str, Any]]] = {
    "write": (1, {"op": "open", "name": "*.distcp"}),
    "finalize": (0, {"op": "open", "name": ".metadata*"}),
}
"""phase -> (the rank that dies, the file operation it dies at): a data file of a non-coordinator, the metadata
of the coordinator."""


def _killed_rank(tmp: str, phase: str) -> str:
    rank, _ = world()
    saver = _first_save(tmp)
    victim, where = KILLS[phase]
    where = _in_format(where)
    new = os.path.join(tmp, "new")
    plan = _plan(new, os.path.join(tmp, "fs.log"), faultfs.Fault("die", **where)) if rank == victim else None
    with faultfs.installed(plan):
        outcome = _whole_save(saver, new, 1, f"the save during which rank {victim} was killed")
    if rank == victim:  # still alive: the layer never saw the file operation; die as the test expects, say so
        _write(os.path.join(tmp, "not-reached"), NOT_REACHED)
        os.kill(os.getpid(), signal.SIGKILL)
    return outcome.text


@pytest.mark.spec("FI-RANK-1", "FI-RANK-2", "FI-RANK-3")
@pytest.mark.parametrize("phase", list(KILLS))
def test_killed_rank_fails_the_save_on_every_survivor(tmp_path, phase):
    tmp, victim = str(tmp_path), KILLS[phase][0]
    _in_format(KILLS[phase][1])  # skips a phase the format does not have
    survivor = 1 - victim
    outcome = on_ranks(
        WORLD, _killed_rank, tmp, phase, timeout=200, expect_exit={victim: -signal.SIGKILL}, backend="gloo"
    )[survivor]
    if os.path.exists(os.path.join(tmp, "not-reached")):
        pytest.skip(NOT_REACHED)
    new = os.path.join(tmp, "new")
    if committed(new, WORLD):
        assert_loads(new, expected(WORLD, 1), call="loading a save committed although a rank was killed in it")
    assert_loads(os.path.join(tmp, "old"), expected(WORLD, 0))
    assert outcome not in ("returned", HUNG), (
        f"rank {victim} was killed in {phase}; the save on rank {survivor}: {outcome}, but it should raise within "
        f"{BOUND:g}s"
    )


# ------------------------------------------------------------------------------------------- hung write


def _hung_write(tmp: str) -> tuple[str, str]:
    """Rank 1's first data write hangs until the gate appears: (abort() outcome, the outcome of the save).

    The ranks coordinate through files, not collectives: the save's own collectives are in flight on the group.
    """
    rank, _ = world()
    saver = _first_save(tmp)
    new, gate, log = os.path.join(tmp, "new"), os.path.join(tmp, "gate"), os.path.join(tmp, "fs.log")
    hung, aborted_0 = os.path.join(tmp, "hung"), os.path.join(tmp, "aborted-0")
    hang = faultfs.Fault("hang", op="write", name=checkpoint_format().data_glob, gate=gate)
    with faultfs.installed(_plan(new, log, hang) if rank == 1 else None):
        handle = start(saver, rank_state(rank, 1), new)
        if rank == 1:
            deadline = time.monotonic() + BOUND
            while not (os.path.exists(log) and faultfs.fired(log, "hang")) and time.monotonic() < deadline:
                time.sleep(0.05)
            _write(hung, "yes" if os.path.exists(log) and faultfs.fired(log, "hang") else "no")
        if wait_for_file(hung, 2 * BOUND) != "yes":
            _write(gate, "go")
            pytest.skip(NOT_REACHED)
        aborted = attempt(handle.abort, bound=EXIT_BOUND, what="abort()")
        if rank == 0:
            _write(aborted_0, "yes")
        else:
            wait_for_file(aborted_0, BOUND)
            _write(gate, "go")  # both ranks tried abort() while the write hung
        finished = attempt(handle.wait, bound=BOUND, what="wait() once the write returned")
    attempt(saver.close, bound=BOUND, what="close()")
    return aborted.text, finished.text


@pytest.mark.spec("FI-HANG-1")
@pytest.mark.parametrize("phase", ["write"])
def test_abort_returns_while_a_write_hangs(tmp_path, phase):
    results = on_ranks(WORLD, _hung_write, str(tmp_path), timeout=200)
    aborts = [r[0] for r in results]
    assert aborts == ["returned"] * WORLD, (
        f"rank 1's write hangs in {phase}; abort() per rank: {aborts}, but it should return within {EXIT_BOUND:g}s"
    )
    assert not any(r[1] == HUNG for r in results), f"wait() after abort(), per rank: {[r[1] for r in results]}"


# ---------------------------------------------------------------------------------------------- crashes


def _phase_of(point: faultfs.Point) -> str:
    name, marker = os.path.basename(point.path.split("->")[-1]), checkpoint_format().marker
    if point.op == "mkdir" and point.path in ("", "."):
        return "plan"
    if marker is None:
        return "write"
    return "finalize" if name.startswith(marker) or point.path == "." else "write"


def _save_in_child(path: str, version: int, log: str | None, fault):
    remove(path)
    plan = _plan(path, log, *((fault,) if fault else ())) if log else None
    with faultfs.installed(plan):
        saver = protocol_saver()
        try:
            save(rank_state(0, version), path, saver, bound=WARM_BOUND)
        finally:
            attempt(saver.close, bound=WARM_BOUND, what="close()")


def _crashes(tmp: str, phase: str) -> tuple[int, int, list[str]]:
    """Crash a one-rank save after each persistence point of `phase`; (points, crashes that fired, problems)."""
    dist.destroy_process_group()  # the forked saves make their own
    old, new, trace = os.path.join(tmp, "old"), os.path.join(tmp, "new"), os.path.join(tmp, "trace.log")
    for name, args in (("old", (old, 0, None, None)), ("trace", (new, 1, trace, None))):
        kind, detail = in_child(tmp, name, _save_in_child, *args)
        assert kind == "ok", f"the {name} save failed: {detail}"
    points = [p for p in faultfs.read_log(trace) if _phase_of(p) == phase] if os.path.exists(trace) else []
    if not points:
        pytest.skip(f"no persistence point of the {phase} phase: {NOT_REACHED}")
    crashed, problems = 0, []
    for point in points:
        log = os.path.join(tmp, f"crash{point.index}.log")
        crash = faultfs.Fault("crash", at=point.index)
        in_child(tmp, f"crash{point.index}", _save_in_child, new, 1, log, crash, crashes=True)
        crashed += bool(faultfs.fired(log, "crash"))
        remove(log)
        for what, version, path in (("previous", 0, old), ("new", 1, new)):
            if what == "previous" or committed(path, 1):
                try:
                    assert_loads(path, expected(1, version))
                except Exception as exc:
                    problems.append(f"crash after {point.op} {point.path}: the {what} checkpoint: {exc}")
    return len(points), crashed, problems


@pytest.mark.spec("FI-CRASH-1")
@pytest.mark.parametrize("phase", ["plan", "write", "finalize"])
def test_crash_after_any_persistence_point(tmp_path, phase):
    points, crashed, problems = on_ranks(1, _crashes, str(tmp_path), phase, timeout=400, backend="gloo")[0]
    # Points may be numbered differently from one run to the next (threads): a run that never reached its point
    # completed instead, so at least one crash must have fired, not every one.
    assert crashed, f"the crash fired at none of the {points} traced points of {phase}"
    assert not problems, f"{len(problems)} problems over {crashed} crashes:\n" + "\n".join(problems[:20])


# ------------------------------------------------------------------------------------------------ damage

DAMAGE_CLAUSES = {"truncate": "FI-TRUNCATE-1", "flip": "FI-BITFLIP-1", "swap": "FI-SWAP-1", "delete": "FI-DELETE-1"}


def _two_saves(tmp: str) -> None:
    rank, _ = world()
    saver = _first_save(tmp)  # tmp/old: checkpoint 0, the source of swapped files
    save(rank_state(rank, 1), os.path.join(tmp, "good"), saver)
    attempt(saver.close, bound=BOUND, what="close()")


def _load_damaged(tmp: str, kind: str, where: str):
    """Save on two ranks, damage one `where` file of the checkpoint (a data file or the format's commit marker),
    load it with the format's stock loader here: (the damaged file's name, the load's Outcome; an AssertionError is
    data that differ from what was saved). Skips "metadata" for a format without a marker."""
    fmt = checkpoint_format()
    if where == "metadata" and fmt.marker is None:
        pytest.skip(f"this target's format ({fmt.name}) has no metadata file: only its data files can be damaged")
    on_ranks(WORLD, _two_saves, tmp)
    good = os.path.join(tmp, "good")
    is_marker = lambda f: os.path.basename(f) == fmt.marker  # noqa: E731
    files = [f for f in files_under(good) if is_marker(f) or fnmatch.fnmatch(os.path.basename(f), fmt.data_glob)]
    files = [f for f in files if is_marker(f) == (where == "metadata")]
    damaged = apply(Damage(kind, file=0, where=0.5, bit=3), files, files_under(os.path.join(tmp, "old")))
    if damaged is None and kind == "swap" and files:
        # The other checkpoint's file of that name holds the same bytes (OLMo-core's .metadata.json is
        # {"ephemeral": false} in every checkpoint): a swap changes nothing, so there is nothing to refuse.
        pytest.skip(f"not applicable: the other checkpoint's {where} file is byte for byte this one's")
    assert damaged is not None, f"no {where} file to damage in {sorted(os.listdir(good))}"
    what = "torch.distributed.checkpoint.load" if fmt.dcp else fmt.loader
    outcome = attempt(assert_loads, good, expected(WORLD, 1), bound=BOUND, what=what)
    return os.path.basename(damaged), outcome


def _damage_cases(clause_of):
    return [
        pytest.param(kind, where, marks=pytest.mark.spec(*clause_of(kind)), id=f"committed-{kind}-{where}")
        for kind in DAMAGE_CLAUSES
        for where in ("data", "metadata")
    ]


@pytest.mark.parametrize(("kind", "where"), _damage_cases(lambda kind: (DAMAGE_CLAUSES[kind], "IN-2")))
def test_damage_after_commit_is_refused_at_load(tmp_path, kind, where):
    name, outcome = _load_damaged(str(tmp_path), kind, where)
    assert not outcome.returned, (
        f"{kind} of {name} in a committed checkpoint: stock {loader()} returned "
        f"{'damaged data' if outcome.text == 'AssertionError' else 'the saved data'} without an error, but the "
        "damage should be refused naming the file"
    )
    assert outcome.text != "AssertionError", (
        f"{kind} of {name} in a committed checkpoint: stock {loader()} returned "
        f"{'damaged data' if outcome.text == 'AssertionError' else 'the saved data'} without an error, but the "
        "damage should be refused naming the file"
    )
    assert name in outcome.message, (
        f"{kind} of {name}: {loader()} raised {outcome.text}, but its message does not name {name}: "
        f"{outcome.message[:300]}"
    )


@pytest.mark.parametrize(("kind", "where"), _damage_cases(lambda kind: ("IN-2w",)))
def test_damage_after_commit_is_never_loaded_silently(tmp_path, kind, where):
    name, outcome = _load_damaged(str(tmp_path), kind, where)
    assert outcome.text != "AssertionError", (
        f"{kind} of {name} in a committed checkpoint: stock {loader()} returned damaged data without an error: "
        f"{outcome.message[:300]}"
    )
