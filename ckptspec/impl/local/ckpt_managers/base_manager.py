"""``BaseCheckpointManager``: the protocol of local checkpointing, independent of where parts are stored.

A checkpoint of iteration i has one part per rank, with id ``(i, rank, session_id)``. With a replication
strategy every rank also stores copies of its clique members' parts. All public methods are collective:
every rank calls them together, and every error is raised on every rank (never on one rank while the
others wait).

Completeness: a part is *usable* by the rank holding it if it is that rank's own part, or, with a
replication strategy, a replica saved under the same placement (same world size and clique). Iteration
i is complete when every rank's part of i is usable somewhere; ``find_latest`` returns the newest
complete iteration, or -1.

Save protocol (commit by rename, two phases):

1. ``save`` checks that the iteration is newer than the newest complete one, snapshots the state dict
   (CPU copies; the caller's object is left as it was; ``_snapshot``), replicates it, and writes every part as *dirty*
   (in the background when ``is_async``).
2. The finalize step, on all ranks: publish (dirty -> clean), then one collective scan. If any rank
   failed, or the iteration is not complete, every rank removes that iteration's parts and raises
   ``CheckpointingException``; the previous checkpoint is untouched. Otherwise every rank removes all
   its other parts, so a rank's storage holds one part per clique member, plus as many dirty ones while a
   save is in flight (the seed's "two parts per rank times the replication factor").

Decisions (the seed leaves these open):

* Any bad call (an iteration that is not a non-negative int newer than the latest complete one, load
  without a complete checkpoint found, storage errors) raises ``CheckpointingException``.
* With replication enabled, ``find_latest`` refuses (``CheckpointingException``, nothing deleted) when any
  rank holds a part saved under other replication parameters: the seed requires the same parameters at
  load. With replication disabled, replicas are ignored (seed) and only own parts count.
* A dirty part, e.g. left by a crash, is never counted, and a later save may overwrite it.
"""

from __future__ import annotations

import copy
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, cast

from ...async_ckpt.core import AsyncRequest
from ...utils import all_gather, dist_rank, errors_by_rank
from ..base_state_dict import TensorAwareStateDict
from ..replication.group_utils import local_copy
from ..replication.strategies import ReplicationStrategy

__all__ = ["BaseCheckpointManager", "CheckpointingException", "CkptID", "SameMachineReplicationException"]

logger = logging.getLogger(__name__)

CkptID = tuple[int, int, Any]
"""(iteration, rank that owns the part, session id)."""

Tag = str | None
"""The placement tag a part was saved under (None: saved without replication)."""


class CheckpointingException(Exception):
    """A local checkpointing operation failed (raised on every rank)."""


class SameMachineReplicationException(CheckpointingException):
    """One save would store the same part twice in one rank's storage."""

    def __init__(self, ckpt_id: CkptID) -> None:
        super().__init__(f"checkpoint part {ckpt_id} would be stored twice on the same rank")


def _raise_if_any(errors: Sequence[str | None], what: str) -> None:
    """Raise CheckpointingException naming every rank whose entry of ``errors`` is not None."""
    failed = errors_by_rank(errors)
    if failed:
        details = "; ".join(f"rank {rank}: {err}" for rank, err in sorted(failed.items()))
        raise CheckpointingException(f"{what} failed on rank(s) {sorted(failed)}: {details}")


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _raised_in(exc: BaseException) -> str:
    """The name of the function that raised ``exc`` (its innermost frame)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_code.co_name if tb is not None else "?"


class BaseCheckpointManager(ABC):
    """The local checkpointing protocol; subclasses store, list, load and remove parts."""

    def __init__(self, session_id: str, repl_strategy: ReplicationStrategy | None = None):
        self.session_id = session_id
        self.repl_strategy = repl_strategy
        self.latest_iteration = -1
        self._found = False  # latest_iteration holds a scan result that no save has invalidated since
        self._usable: list[list[CkptID]] = []
        self._tags: dict[CkptID, Tag] = {}

    @property
    def rank(self) -> int:
        return dist_rank()

    # ------------------------------------------------------------------ storage (subclasses)

    @abstractmethod
    def _my_parts(self) -> list[tuple[CkptID, Tag]]:
        """The clean parts in this rank's storage, with their tags (raises if it cannot be read)."""

    @abstractmethod
    def _load(self, ckpt_id: CkptID, tag: Tag) -> TensorAwareStateDict:
        """Read a clean part."""

    @abstractmethod
    def _save_call(
        self, parts: dict[CkptID, TensorAwareStateDict], tag: Tag
    ) -> tuple[Callable[..., None], tuple[Any, ...]]:
        """(fn, args): a picklable call that writes ``parts`` as dirty parts; it may run in another process."""

    @abstractmethod
    def _check_loadable(self, snapshot: TensorAwareStateDict) -> None:
        """Raise if ``snapshot`` could not be loaded back once saved (refused at save, on every rank, not at load)."""

    @abstractmethod
    def _check_part(self, ckpt_id: CkptID, tag: Tag) -> None:
        """Raise if the clean part is not intact (find_latest counts only intact parts, IN-3)."""

    @abstractmethod
    def _publish(self, ckpt_ids: Sequence[CkptID], tag: Tag) -> None:
        """Turn the dirty parts written by the save call into clean ones (raises if one is missing)."""

    @abstractmethod
    def _discard(self, iteration: int) -> None:
        """Remove every part (clean or dirty) of ``iteration`` from this rank's storage."""

    @abstractmethod
    def _cleanup(self, iteration: int) -> None:
        """Remove every part (clean or dirty) of any other iteration from this rank's storage."""

    # ---------------------------------------------------------------------------- public API

    def find_latest(self) -> int:
        """The newest iteration complete across all ranks, or -1. Collective."""
        self.latest_iteration = self._scan(strict=True)
        self._found = True
        return self.latest_iteration

    def load(self) -> tuple[TensorAwareStateDict, CkptID]:
        """This rank's part of the iteration found by ``find_latest`` and its id. Collective.

        Parts this rank lacks are fetched from clique members when replication is enabled.
        """
        if not self._found or self.latest_iteration < 0:
            raise CheckpointingException(
                "no complete local checkpoint to load: call find_latest() first (it returns -1 when there is none)"
            )
        my_id = (self.latest_iteration, self.rank, self.session_id)
        if self.repl_strategy is None:
            plan, wanted = None, [my_id]
        else:
            plan = self.repl_strategy.retrieve_plan(self._usable, [my_id])
            wanted = sorted(cast("set[CkptID]", plan.required_ids()))  # the ids given to retrieve_plan
        my_data, error = {}, None
        try:
            for ckpt_id in wanted:
                my_data[ckpt_id] = self._load(ckpt_id, self._tags.get(ckpt_id))
        except Exception as exc:
            error = _describe(exc)
        _raise_if_any(all_gather(error), f"loading local checkpoint iteration {self.latest_iteration}")
        if plan is not None:
            assert self.repl_strategy is not None  # the plan is the strategy's
            my_data = self.repl_strategy.retrieve_execute(plan, my_data)
        state_dict = my_data[my_id]
        state_dict.restore_tensor_device(non_blocking=False)
        logger.debug("rank %d loaded local checkpoint part %s", self.rank, my_id)
        return state_dict, my_id

    def save(self, state_dict: TensorAwareStateDict, iteration: int, is_async: bool = False) -> AsyncRequest | None:
        """Save this rank's part of ``iteration``. Collective.

        Synchronous: returns None once the checkpoint is complete on every rank. Asynchronous: returns
        an AsyncRequest (for an AsyncCallsQueue) whose finalize step completes the save. ``state_dict``
        is snapshotted before returning and left as it was.
        """
        if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
            raise CheckpointingException(f"iteration must be a non-negative int, got {iteration!r}")
        snapshot, error = None, None
        try:
            snapshot = self._snapshot(state_dict)
        except Exception as exc:
            error = f"cannot snapshot the state dict: {_describe(exc)}"
        if error is None:
            assert snapshot is not None  # _snapshot returned
            try:
                self._check_loadable(snapshot)
            except Exception as exc:
                error = str(exc) if isinstance(exc, CheckpointingException) else _describe(exc)
        newest = self._scan(strict=False, local_error=error)  # also spreads a snapshot error to every rank
        if iteration <= newest:
            raise CheckpointingException(
                f"cannot save iteration {iteration}: it is not newer than the latest complete local "
                f"checkpoint, iteration {newest}"
            )
        self._found, self.latest_iteration = False, -1
        my_id = (iteration, self.rank, self.session_id)
        assert snapshot is not None  # else _scan raised the snapshot error
        if self.repl_strategy is None:
            parts, tag = {my_id: snapshot}, None
        else:
            copies, ids = self.repl_strategy.replicate(snapshot, my_id)
            parts, tag = dict(zip(ids, copies, strict=True)), self.repl_strategy.placement_tag
        fn, args = self._save_call(parts, tag)
        ids = list(parts)

        def finalize_fn(write_error: str | None = None) -> None:
            self._finalize(iteration, ids, tag, write_error)

        if is_async:
            return AsyncRequest(fn, args, [finalize_fn])
        write_error = None
        try:
            fn(*args)
        except Exception as exc:
            logger.error(
                "rank %d could not write local checkpoint iteration %d: %s", self.rank, iteration, _describe(exc)
            )
            write_error = _describe(exc)
        finalize_fn(write_error)
        return None

    # -------------------------------------------------------------------------------- steps

    def _snapshot(self, state_dict: TensorAwareStateDict) -> TensorAwareStateDict:
        """A CPU copy of ``state_dict`` (LM-17).

        With the full interface the tensors are popped, copied and put back, so the caller's object is left as
        it was (LM-15). Without replication, a TASD that implements only the device moves is copied the way
        NVRx saves it: ``copy_tensors_to_cpu``, a deep copy, ``restore_tensor_device``.
        """
        try:
            return local_copy(state_dict, "cpu")
        except NotImplementedError as exc:
            method = _raised_in(exc)
            if self.repl_strategy is not None:
                raise CheckpointingException(
                    f"replication needs {type(state_dict).__name__}.{method}(), which raised NotImplementedError: "
                    "a TensorAwareStateDict saved with a replication strategy must implement the whole interface"
                ) from exc
            logger.debug("%s.%s() is not implemented: snapshot by device moves", type(state_dict).__name__, method)
        state_dict.copy_tensors_to_cpu(non_blocking=False)
        try:
            return copy.deepcopy(state_dict)
        finally:
            state_dict.restore_tensor_device(non_blocking=False)

    def _finalize(self, iteration: int, ids: list[CkptID], tag: Tag, write_error: str | None) -> None:
        """Publish this rank's parts, then agree (collectively) on success or roll back everywhere."""
        error = write_error
        if error is None:
            try:
                self._publish(ids, tag)
            except Exception as exc:
                error = _describe(exc)
        try:
            newest = self._scan(strict=False, local_error=error)
            if newest != iteration:
                raise CheckpointingException(
                    f"local checkpoint iteration {iteration} is incomplete after saving (newest complete: {newest})"
                )
        except CheckpointingException as exc:
            self._best_effort(self._discard, iteration)
            raise CheckpointingException(
                f"saving local checkpoint iteration {iteration} failed; it was removed on every rank: {exc}"
            ) from None
        self._best_effort(self._cleanup, iteration)
        self.latest_iteration, self._found = iteration, True
        logger.info("rank %d saved local checkpoint iteration %d", self.rank, iteration)

    def _best_effort(self, fn: Callable[[int], None], iteration: int) -> None:
        try:
            fn(iteration)
        except Exception as exc:
            logger.warning("rank %d: %s(%d) failed: %s", self.rank, fn.__name__, iteration, _describe(exc))

    def _scan(self, strict: bool, local_error: str | None = None) -> int:
        """Collective: gather every rank's usable parts; return the newest complete iteration.

        Raises CheckpointingException on every rank if any rank reports ``local_error`` or cannot read
        its storage, or (``strict``) holds parts saved under other replication parameters.
        """
        usable: list[CkptID] = []
        mismatched: list[str] = []
        tags: dict[CkptID, Tag] = {}
        if local_error is None:
            try:
                parts = self._my_parts()
                if strict:  # find_latest: never count a part that cannot be loaded intact
                    parts = [(ckpt_id, tag) for ckpt_id, tag in parts if self._intact(ckpt_id, tag)]
                usable, mismatched, tags = self._classify(parts)
            except Exception as exc:
                local_error = f"cannot read local checkpoint storage: {_describe(exc)}"
        gathered = all_gather((usable, mismatched, local_error))
        _raise_if_any([g[2] for g in gathered], "local checkpointing")
        if strict:
            _raise_if_any(
                [
                    f"holds {', '.join(g[1])}, but this manager replicates as {self._my_tag()}" if g[1] else None
                    for g in gathered
                ],
                "finding local checkpoints (replication parameters differ from the save's; use the same "
                "ones, or disable replication to ignore replicas)",
            )
        self._usable, self._tags = [g[0] for g in gathered], tags
        owners: dict[int, set[int]] = {}
        for held in self._usable:
            for iteration, owner, _ in held:
                owners.setdefault(iteration, set()).add(owner)
        everyone = set(range(len(gathered)))
        newest = max((i for i, o in owners.items() if o == everyone), default=-1)
        logger.debug("rank %d: newest complete local checkpoint iteration %d", self.rank, newest)
        return newest

    def _intact(self, ckpt_id: CkptID, tag: Tag) -> bool:
        if ckpt_id[2] != self.session_id:
            return True  # not ours: never counted anyway
        try:
            self._check_part(ckpt_id, tag)
        except Exception as exc:
            logger.error("rank %d: local checkpoint part %s is not used: %s", self.rank, ckpt_id[:2], _describe(exc))
            return False
        return True

    def _my_tag(self) -> Tag:
        return None if self.repl_strategy is None else self.repl_strategy.placement_tag

    def _classify(self, parts: list[tuple[CkptID, Tag]]) -> tuple[list[CkptID], list[str], dict[CkptID, Tag]]:
        """(usable ids, descriptions of parts saved under other replication parameters, id -> tag)."""
        my_tag, usable, mismatched, tags = self._my_tag(), [], [], {}
        for ckpt_id, tag in sorted(parts, key=lambda p: (p[0][:2], p[1] != my_tag)):
            if ckpt_id[2] != self.session_id or ckpt_id in tags:
                continue
            own = ckpt_id[1] == self.rank
            if self.repl_strategy is not None and tag is not None and tag != my_tag:
                mismatched.append(f"part {ckpt_id[:2]} saved as {tag}")
                if not own:
                    continue
            elif not own and (self.repl_strategy is None or tag is None):
                continue
            usable.append(ckpt_id)
            tags[ckpt_id] = tag
        return usable, mismatched, tags
