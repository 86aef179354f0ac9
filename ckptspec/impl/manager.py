"""A reference checkpoint manager: asynchronous saves at increasing steps, a pointer, retention, resume.

The model a library author can compare with (clauses MG-*, ckptspec/spec/clauses/manager.toml). Layout below `root`:

    step-<N>/rank-<r>.pt     each rank's state dict (torch.save), written by a background thread
    step-<N>/manifest.json   the checkpoint's metadata: world size and each rank file's size and CRC32 (rank 0)
    LATEST                   the pointer: the newest step and the list of retained steps (rank 0)

Persistence order, each step durable before the next (tmp file, write, fsync, rename, fsync of the directory):
every rank's data file, then (after every rank reported success) the manifest, then the pointer. Publishing the
pointer is the commit: a step not listed in `LATEST` does not exist for resume, whatever its directory holds, so a
save killed or failed at any point before that rename leaves the previous checkpoint the one resumed. Retention acts
only after the pointer naming the new step is durable, and deletes only what the new pointer no longer lists (a
directory left over from a failed or killed save included); it never runs after a failed save.

`wait()` is collective: each rank's outcome of its data write, then rank 0's outcome of the manifest and the
pointer, are gathered, so a failure anywhere (ENOSPC, EDQUOT, EIO on the pointer included) raises
`CheckpointSaveError` on every rank. Resume tries the pointer's steps newest first and refuses one whose files are
missing or do not match their manifest (size and CRC32), falling back to the next; `CheckpointSaveError` if no listed
checkpoint is intact. The state dict is copied (tensors cloned) before save() returns, so the trainer may change it.
"""

from __future__ import annotations

import copy
import io
import json
import os
import threading
from typing import Any

import torch
import torch.distributed as dist

from ckptspec.impl.integrity import crc32, make_dirs, open_new

__all__ = ["POINTER", "CheckpointSaveError", "ReferenceManager"]

POINTER = "LATEST"
MANIFEST = "manifest.json"


class CheckpointSaveError(RuntimeError):
    """A save failed on some rank (raised on every rank), or no checkpoint the pointer lists is intact."""


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: str, data: bytes) -> None:
    """`path` holds `data` whole or is unchanged, and survives a power loss once this returns."""
    tmp = path + ".tmp"
    with open_new(tmp) as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(os.path.dirname(path) or ".")


def _world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _gather(value: Any) -> list[Any]:
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        values: list[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(values, value)
        return values
    return [value]


def _snapshot(state: Any) -> Any:
    """A copy of `state` the trainer cannot change: tensors cloned to the CPU, containers copied."""
    if isinstance(state, torch.Tensor):
        return state.detach().to("cpu", copy=True)
    if isinstance(state, dict):
        return {k: _snapshot(v) for k, v in state.items()}
    if isinstance(state, (list, tuple)):
        return type(state)(_snapshot(v) for v in state)
    return copy.deepcopy(state)


class ReferenceManager:
    """Saves, retains and resumes the checkpoints below `root`, keeping the `keep` newest (0: all)."""

    def __init__(self, root: str, keep: int = 0):
        if keep < 0:
            raise ValueError(f"keep must be 0 (retain all) or positive, not {keep}")
        self.root, self.keep = root, keep
        self.pointer = os.path.join(root, POINTER)
        self._thread: threading.Thread | None = None
        self._step: int | None = None
        self._outcome: tuple[bool, Any] = (True, None)
        self._last: int | None = None

    # ------------------------------------------------------------------------------------------------ paths
    def location(self, step: int) -> str:
        return os.path.join(self.root, f"step-{step}")

    def steps(self) -> list[int]:
        if not os.path.isdir(self.root):
            return []
        names = (n for n in os.listdir(self.root) if n.startswith("step-") and n[5:].isdigit())
        return sorted(int(n[5:]) for n in names)

    def _listed(self) -> list[int]:
        """The steps the pointer lists, oldest first ([] without a readable pointer)."""
        try:
            with open(self.pointer, "rb") as f:
                record = json.loads(f.read())
            return [int(s) for s in record["steps"]]
        except (OSError, ValueError, KeyError, TypeError):
            return []

    # ------------------------------------------------------------------------------------------------ saving
    def save(self, step: int, state_dict: dict[str, Any]) -> None:
        """Start saving `state_dict` as `step` (after the previous save is committed); collective."""
        self.wait()
        newest = max(self._listed(), default=None) if self._last is None else self._last
        if newest is not None and step <= newest:
            raise ValueError(f"step {step} is not newer than the newest checkpoint, step {newest}")
        snapshot = _snapshot(state_dict)
        self._step, self._outcome = step, (True, None)
        self._thread = threading.Thread(target=self._write, args=(step, snapshot), name=f"ckpt-save-{step}")
        self._thread.start()

    def _write(self, step: int, state: dict[str, Any]) -> None:
        try:
            rank, _ = _world()
            buffer = io.BytesIO()
            torch.save(state, buffer)
            data = buffer.getvalue()
            make_dirs(self.location(step))
            _write_durably(os.path.join(self.location(step), f"rank-{rank}.pt"), data)
            self._outcome = (True, (len(data), crc32(data)))
        except BaseException as exc:  # reported by wait() on every rank
            self._outcome = (False, f"{type(exc).__name__}: {exc}")

    def wait(self) -> None:
        """Finish the save in flight: commit it on rank 0 once every rank wrote, then apply retention; collective.
        Raises CheckpointSaveError on every rank if any rank's write, the manifest or the pointer failed."""
        if self._thread is None:
            return
        self._thread.join()
        step, self._thread = self._step, None
        assert step is not None
        outcomes = _gather(self._outcome)
        failed = {r: detail for r, (ok, detail) in enumerate(outcomes) if not ok}
        if failed:
            raise CheckpointSaveError(f"the save of step {step} failed on ranks {sorted(failed)}: {failed}")
        rank, world = _world()
        commit: tuple[bool, Any] = (True, None)
        if rank == 0:
            try:
                self._commit(step, world, [detail for _, detail in outcomes])
            except BaseException as exc:
                commit = (False, f"{type(exc).__name__}: {exc}")
        ok, detail = _gather(commit)[0]
        if not ok:
            raise CheckpointSaveError(
                f"committing step {step} failed on rank 0 (the previous pointer stands): {detail}"
            )
        self._last = step

    def _commit(self, step: int, world: int, files: list[tuple[int, int]]) -> None:
        manifest = {"step": step, "world": world, "files": {f"rank-{r}.pt": list(f) for r, f in enumerate(files)}}
        _write_durably(os.path.join(self.location(step), MANIFEST), json.dumps(manifest).encode())
        retained = sorted({*self._listed(), step})
        if self.keep:
            retained = retained[-self.keep :]
        _write_durably(self.pointer, json.dumps({"latest": step, "steps": retained}).encode())
        for old in self.steps():  # only once the pointer that no longer lists them is durable
            if old not in retained:
                self._remove(old)

    def _remove(self, step: int) -> None:
        """Delete `step`'s directory, its manifest first; a failure leaves the rest for the next save."""
        where = self.location(step)
        try:
            names = sorted(os.listdir(where), key=lambda n: n != MANIFEST)
            for name in names:
                os.unlink(os.path.join(where, name))
            os.rmdir(where)
        except OSError:
            pass  # the pointer no longer lists it: what is left is never resumed, and the next save retries

    def close(self) -> None:
        self.wait()

    # ------------------------------------------------------------------------------------------------ resuming
    def latest(self) -> int | None:
        return max(self._listed(), default=None)

    def _intact(self, step: int) -> dict[str, Any] | None:
        """The merged state of `step`, or None if a file is missing or does not match its manifest."""
        try:
            with open(os.path.join(self.location(step), MANIFEST), "rb") as f:
                manifest = json.loads(f.read())
            merged: dict[str, Any] = {}
            for name, (size, checksum) in manifest["files"].items():
                with open(os.path.join(self.location(step), name), "rb") as f:
                    data = f.read()
                if len(data) != size or crc32(data) != checksum:
                    return None
                merged.update(torch.load(io.BytesIO(data), weights_only=False))
            return merged
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def load(self, step: int, template: dict[str, Any] | None = None) -> dict[str, Any]:
        """The state of `step` (the keys of `template`, or all); CheckpointSaveError unless it is intact."""
        state = self._intact(step)
        if state is None:
            raise CheckpointSaveError(f"the checkpoint of step {step} below {self.root} is missing or damaged")
        return state if template is None else {k: state[k] for k in template}

    def resume(self, template: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]] | None:
        """(step, state) of the newest listed checkpoint that is intact (the keys of `template`, or all); None if
        the pointer lists none; CheckpointSaveError if it lists some and none is intact."""
        listed = self._listed()
        for step in reversed(listed):
            state = self._intact(step)
            if state is not None:
                return step, state if template is None else {k: state[k] for k in template}
        if listed:
            raise CheckpointSaveError(f"no checkpoint the pointer lists is intact: steps {listed} below {self.root}")
        return None
