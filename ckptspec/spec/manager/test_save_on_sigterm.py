"""A SIGTERM between saves, with the manager's save on SIGTERM enabled, leaves a checkpoint of the work since the
last one that resume loads exactly, and the trainer ends (MG-TERM-2).

Step 1 is committed (by a manager as every other test makes it). Then a forked trainer
(ckptspec.spec.drivers.faults.preemption) makes a new manager over the same root, turns its save on SIGTERM on
(`enable_save_on_sigterm()`) and trains on: `advance(step, state)` for steps 2, 3, ..., STEP_SECONDS apart, no save
due at any of them, as a loop that saves every so many steps runs between two saves. Once step READY is advanced it
creates a file, and the parent sends it SIGTERM; the trainer goes on advancing until the manager asks it to stop
(advance() returns True), then closes the manager and returns, so the process ends. It writes what it did (the last
step advanced, whether it was asked to stop, or the traceback of what it raised) to a record, unless the signal
ended it first. The parent waits TERM_BOUND seconds for it to end (then SIGKILLs its session) and reaps it; a new
manager resumes. The checkpoint must be of a step from READY (the loop had reached it before the signal) to the last
one advanced, exactly that step's state, and the trainer must have ended within the bound.

The trainer calls enable_save_on_sigterm() and advance() on its main thread, as a training script does (a library
installs its handler there; signal.signal refuses any other thread), not through asserts.bounded's helper thread:
the parent's bounds hold them instead (REACH up to step READY, TERM_BOUND after the signal).
"""

from __future__ import annotations

import json
import os
import time
import traceback
from typing import Any

import pytest

from ckptspec.spec.drivers.faults.crash_points import in_child
from ckptspec.spec.drivers.faults.preemption import TERM_BOUND, terminated
from ckptspec.spec.drivers.manager_saves import assert_step, managed, resumed, save_steps, step_state

pytestmark = pytest.mark.needs("manager", "manager_sigterm_save")

READY = 2
"""The step the loop has advanced (past the committed step 1) when it asks for the signal."""
STEP_SECONDS = 0.05
"""The time one training step takes here (a sleep between two advance() calls)."""
LOOP_SECONDS = 2 * TERM_BOUND
"""How long the trainer advances after READY at most, if nothing stops it (the parent's bound comes first)."""


def _commit_one(root: str) -> None:
    with managed(root) as manager:
        save_steps(manager, [1])


def _record(path: str, record: dict[str, Any]) -> None:
    with open(path + ".tmp", "w") as f:
        json.dump(record, f)
    os.replace(path + ".tmp", path)


def _train(root: str, ready: str, record: str) -> None:
    """The trainer: enable the save on SIGTERM, advance step after step, READY then the signal, until asked to stop."""
    done: dict[str, Any] = {"advanced": None, "stopped": False, "error": None}
    try:
        with managed(root) as manager:
            manager.enable_save_on_sigterm()
            step, deadline = READY, None
            while deadline is None or time.monotonic() < deadline:
                stop = manager.advance(step, step_state(step))
                done["advanced"] = step
                if stop:
                    done["stopped"] = True
                    break
                if step == READY:
                    open(ready, "w").close()
                    deadline = time.monotonic() + LOOP_SECONDS
                step += 1
                time.sleep(STEP_SECONDS)
    except BaseException:
        done["error"] = traceback.format_exc()
        raise
    finally:
        _record(record, done)


def _read(record: str) -> dict[str, Any] | None:
    if not os.path.exists(record):
        return None
    with open(record) as f:
        loaded: dict[str, Any] = json.load(f)
    return loaded


@pytest.mark.spec("MG-TERM-2")
def test_sigterm_between_saves_saves_the_work_since_the_last_checkpoint(tmp_path):
    tmp, root = str(tmp_path), str(tmp_path / "ckpt")
    kind, result = in_child(tmp, "committed", _commit_one, root)
    assert kind == "ok", f"saving step 1 failed: {result}"
    ready, record = os.path.join(tmp, "ready"), os.path.join(tmp, "trainer.json")
    outcome = terminated(tmp, "trainer", _train, root, ready, record, ready=ready)
    done = _read(record)
    what = f"the trainer ended by {outcome.ended_by} {outcome.seconds:.1f}s after SIGTERM; it reported {done}"
    assert outcome.reached, f"the trainer never advanced to step {READY} to be signalled: {what}"
    kind, result = in_child(tmp, "resume", resumed, root)
    assert kind == "ok", f"resume: {result}"
    last = done["advanced"] if done and done["advanced"] is not None else READY
    assert isinstance(result, tuple), (
        f"resume() after SIGTERM should load a step from {READY} on, but returned {result!r} ({what})"
    )
    got = result[0]
    assert READY <= got <= last, (
        f"after SIGTERM at step {READY} or later (step 1 committed, the last step advanced {last}), resume() "
        f"should load a step from {READY} to {last}, but loaded step {got}: the work since the last checkpoint "
        f"is lost ({what})"
    )
    assert_step(result, got, what=f"resume() after SIGTERM ({what})")
    assert outcome.ended_by != "SIGKILL after the bound", (
        f"the trainer did not end within {TERM_BOUND:g}s of SIGTERM although step {got} was saved ({what})"
    )
