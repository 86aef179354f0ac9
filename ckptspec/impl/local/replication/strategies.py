"""Replication strategies: where the copies of each rank's checkpoint part live, and how they move.

``CliqueReplicationStrategy`` splits the ranks into cliques (see ``parse_group_sequence``); at save
every clique member receives a copy of every other member's part, and at load a rank missing its
part gets it from a clique member that holds it.

Decisions:

* Invalid ``(world_size, replication_jump, replication_factor)`` raise ValueError on every rank,
  before any process group is created. ``replication_factor=1`` is valid (cliques of one, no copies).
* The default ``replication_jump`` is the number of visible GPUs at call time (one node's ranks, so
  copies land on other nodes); with no GPU it must be given.
* ``replicate`` leaves the caller's state dict as it was and returns it as its own entry.
* The sender of a missing part is its lowest-ranked holder in the clique: deterministic, no RNG.
* ``placement_tag`` names the layout (world size and this rank's clique); the manager records it
  with every part, so parts saved under other replication parameters are recognised.

``LazyCliqueReplicationStrategy`` (NVRx's name) takes the same parameters but creates the process groups only
when first used (any method, ``placement_tag`` included), so it can be made before ``torch.distributed`` is.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Hashable, Sequence
from typing import Any, Generic, TypeVar

import torch
import torch.distributed as dist

from ..base_state_dict import TensorAwareStateDict
from .group_utils import ExchangePlan, broadcast_state_dict, parse_group_sequence, recv_state_dict, send_state_dict

__all__ = [
    "CliqueReplicationStrategy",
    "EagerT",
    "LazyCliqueReplicationStrategy",
    "LazyReplicationStrategyBuilder",
    "NoReplicasAvailableError",
    "ReplicationStrategy",
]

logger = logging.getLogger(__name__)

_Id = TypeVar("_Id", bound=Hashable)  # the caller's kind of part id: what it passes in, it gets back


class NoReplicasAvailableError(Exception):
    """No member of the clique holds a part some member needs."""


class ReplicationStrategy(ABC):
    """How parts are replicated at save and retrieved at load. All methods are collective."""

    @abstractmethod
    def replicate(self, local_ckpt: TensorAwareStateDict, id_: _Id) -> tuple[list[TensorAwareStateDict], list[_Id]]:
        """Exchange parts: return the parts this rank must store (its own included) and their ids."""

    @abstractmethod
    def retrieve_plan(
        self, globally_available_ids: Sequence[Sequence[Hashable]], wanted: Sequence[Hashable]
    ) -> ExchangePlan:
        """Plan who sends what so every rank gets the ids it wants.

        ``globally_available_ids[r]`` lists the ids global rank r holds. Raises
        NoReplicasAvailableError when a wanted id has no holder the strategy can use.
        """

    @abstractmethod
    def retrieve_execute(
        self, plan: ExchangePlan, my_data: dict[_Id, TensorAwareStateDict]
    ) -> dict[_Id, TensorAwareStateDict]:
        """Carry out ``plan``; ``my_data`` holds what this rank sends. Returns what it receives."""

    @property
    @abstractmethod
    def placement_tag(self) -> str:
        """Names this rank's replica placement; equal tags mean the same replication layout."""


class CliqueReplicationStrategy(ReplicationStrategy):
    """Full replication within ``local_group``, the clique this rank belongs to."""

    def __init__(self, local_group: dist.ProcessGroup | None, target_device: torch.device | str = "cpu") -> None:
        self.local_group = local_group
        self.target_device = torch.device(target_device)
        self.ranks: list[int] = list(dist.get_process_group_ranks(local_group))
        if dist.get_rank() not in self.ranks:
            raise ValueError(f"rank {dist.get_rank()} is not in the replication group {self.ranks}")

    @classmethod
    def from_replication_params(
        cls, replication_jump: int | None = None, replication_factor: int = 2
    ) -> CliqueReplicationStrategy:
        """Create every clique's process group (collective) and keep this rank's clique."""
        if replication_jump is None:
            replication_jump = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if replication_jump == 0:
                raise ValueError(
                    "replication_jump defaults to the number of GPUs per node, and none is "
                    "visible: pass replication_jump explicitly"
                )
        cliques = parse_group_sequence(replication_jump, replication_factor, dist.get_world_size())
        rank, mine = dist.get_rank(), None
        for clique in cliques:  # every rank must create every group, in the same order
            group = dist.new_group(clique)
            if rank in clique:
                mine = group
        logger.debug("rank %d replicates within %s", rank, next(c for c in cliques if rank in c))
        return cls(mine, target_device="cpu")

    @property
    def placement_tag(self) -> str:
        return f"w{dist.get_world_size()}c{'-'.join(map(str, self.ranks))}"

    def replicate(self, local_ckpt: TensorAwareStateDict, id_: _Id) -> tuple[list[TensorAwareStateDict], list[_Id]]:
        ids: list[Any] = [None] * len(self.ranks)  # all_gather_object fills in each member's id
        dist.all_gather_object(ids, id_, group=self.local_group)
        me = dist.get_rank()
        parts = [
            broadcast_state_dict(local_ckpt if src == me else None, src, self.local_group, self.target_device)
            for src in self.ranks
        ]
        return parts, ids

    def retrieve_plan(
        self, globally_available_ids: Sequence[Sequence[Hashable]], wanted: Sequence[Hashable]
    ) -> ExchangePlan:
        gathered: list[Any] = [None] * len(self.ranks)  # all_gather_object fills in each member's list of ids
        dist.all_gather_object(gathered, list(wanted), group=self.local_group)
        plan, missing = ExchangePlan(), []
        for receiver, wants in zip(self.ranks, gathered, strict=True):
            for id_ in wants:
                holders = [m for m in self.ranks if id_ in globally_available_ids[m]]
                if not holders:
                    missing.append(f"{id_!r} (wanted by rank {receiver})")
                    continue
                plan.plan(receiver if receiver in holders else holders[0], receiver, id_)
        if missing:
            raise NoReplicasAvailableError(
                f"no member of the replication clique {self.ranks} holds {', '.join(missing)}"
            )
        return plan

    def retrieve_execute(  # the plan's ids are Hashable: the caller's _Id, unknown to the plan
        self, plan: ExchangePlan, my_data: dict[Any, TensorAwareStateDict]
    ) -> dict[Any, TensorAwareStateDict]:
        absent = plan.required_ids() - set(my_data)
        if absent:
            raise ValueError(f"my_data lacks the parts this rank must send: {sorted(map(repr, absent))}")
        me = dist.get_rank()
        received: dict[Any, TensorAwareStateDict] = {}
        for entry in plan.entries:
            if entry.sender == me and entry.receiver == me:
                received[entry.id_] = my_data[entry.id_]
            elif entry.sender == me:
                send_state_dict(my_data[entry.id_], entry.receiver, self.local_group)
            elif entry.receiver == me:
                received[entry.id_] = recv_state_dict(entry.sender, self.local_group, self.target_device)
        return received


EagerT = TypeVar("EagerT", bound=ReplicationStrategy)
"""The kind of strategy a ``LazyReplicationStrategyBuilder`` builds."""


class LazyReplicationStrategyBuilder(ReplicationStrategy, ABC, Generic[EagerT]):
    """A strategy built on first use (``_eager_build``), then used for every call: its process groups are created
    when the strategy is first needed, not when it is made."""

    def __init__(self) -> None:
        self._replication_strategy: EagerT | None = None

    @property
    def replication_strategy(self) -> EagerT:
        """The built strategy (built now if it was not yet: a collective, on every rank)."""
        if self._replication_strategy is None:
            self._replication_strategy = self._eager_build()
        return self._replication_strategy

    @abstractmethod
    def _eager_build(self) -> EagerT:
        """Build the strategy (collective)."""

    def replicate(self, local_ckpt: TensorAwareStateDict, id_: _Id) -> tuple[list[TensorAwareStateDict], list[_Id]]:
        return self.replication_strategy.replicate(local_ckpt, id_)

    def retrieve_plan(
        self, globally_available_ids: Sequence[Sequence[Hashable]], wanted: Sequence[Hashable]
    ) -> ExchangePlan:
        return self.replication_strategy.retrieve_plan(globally_available_ids, wanted)

    def retrieve_execute(
        self, plan: ExchangePlan, my_data: dict[_Id, TensorAwareStateDict]
    ) -> dict[_Id, TensorAwareStateDict]:
        return self.replication_strategy.retrieve_execute(plan, my_data)

    @property
    def placement_tag(self) -> str:
        return self.replication_strategy.placement_tag


class LazyCliqueReplicationStrategy(LazyReplicationStrategyBuilder[CliqueReplicationStrategy]):
    """``CliqueReplicationStrategy.from_replication_params(replication_jump, replication_factor)``, built on first
    use. ``replication_jump`` defaults to the number of GPUs visible when this class was defined, as in NVRx."""

    def __init__(self, replication_jump: int = torch.cuda.device_count(), replication_factor: int = 2):
        super().__init__()
        self.replication_jump = replication_jump
        self.replication_factor = replication_factor

    def _eager_build(self) -> CliqueReplicationStrategy:
        return CliqueReplicationStrategy.from_replication_params(self.replication_jump, self.replication_factor)
