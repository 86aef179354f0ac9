"""Save a state dict in the torch.distributed.checkpoint format in three steps: plan, write (async), finalize.

``save_state_dict_async_plan`` plans on every rank and prepares the writer; the write runs wherever the
caller puts ``storage_writer.get_save_function_and_args()`` (an AsyncRequest); ``save_state_dict_async_finalize``
gathers the write results and lets the coordinator commit the metadata. Signature-compatible with NVRx
``async_ckpt.state_dict_saver``.

Planning takes one of four paths, all of which call ``planner.finish_plan`` and prepare the writer's buckets:

* prepared (``enable_cache=True``, a repeated save): each rank compares a fingerprint of its state dict with the
  one of its previous save planned in full (per value: its path and type; per tensor: its shape, dtype, device,
  ``requires_grad``, layout and, on a machine with CUDA, whether a CPU tensor is pinned: what the plan and the
  metadata depend on). Where it holds on every rank (one integer all-reduce, the only collective), the cached plan and
  metadata are reused and the writer's buckets are filled from the previous save's template: no planner set-up,
  no local plan, no plan comparison; each value is taken from this state dict (a tensor as it is now, a
  non-tensor pickled anew). It holds only for plain tensors (``torch.Tensor``, ``nn.Parameter``; not DTensor or
  ShardedTensor), torch's ``DefaultSavePlanner`` itself (a subclass may resolve data its own way) with the same
  settings, and the same writer settings; otherwise the save plans in
  full (the next path), and a full plan leaves the template for the next save;
* cached: with a metadata cache holding a previous plan, every rank checks that its local plan is unchanged
  (one integer all-reduce); if so, the cached global plan and metadata are reused and no plan is exchanged;
* decentralized, when planner and writer both allow it: the coordinator gathers the local plans to build the
  metadata (skipped when ``verify_global_md_reuse`` accepts the plans loaded with
  ``init_checkpoint_metadata_cache``) and every rank makes its global plan locally;
* central: the local plans are gathered, the coordinator makes the global plan, and each rank gets its part.

Errors are collective: a planning error on any rank, a failed write on any rank, or a failed metadata
commit raise ``CheckpointException`` on every rank, and the metadata is written only if every rank's writes
succeeded.

Decisions: a cached plan is reused only while every rank's local plan (keys, shapes, dtypes, ...) is
unchanged, so a changed structure never reuses a stale plan; the prepared path's agreement stays in the trainer's
call: a rank whose structure changed must plan collectively, so every rank must know it before the call returns; ``enable_cache=True`` without
``metadata_cache`` uses the module's cache (created on first use); ``verify_global_md_reuse`` works with any
backend (its flag tensor lives where the backend wants it).
"""

from __future__ import annotations

import logging
import pickle
from collections.abc import Callable, Mapping
from dataclasses import fields
from operator import attrgetter, itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, WriteItem, WriteItemType
from torch.distributed.checkpoint.storage import WriteResult
from torch.distributed.checkpoint.utils import _DistWrapper

from ..phases import mark
from ..utils import all_reduce, dist_ready, paused_gc
from .filesystem_async import FileSystemWriterAsync, ResultRow, results_of

if TYPE_CHECKING:
    from .filesystem_async import WriteTemplate

__all__ = [
    "CheckpointMetadataCache",
    "get_metadata_caching_status",
    "init_checkpoint_metadata_cache",
    "save_state_dict_async_finalize",
    "save_state_dict_async_plan",
    "verify_global_md_reuse",
]

logger = logging.getLogger(__name__)

SaveStateDictRet = tuple["FileSystemWriterAsync", Metadata | None, _DistWrapper]


class CheckpointMetadataCache:
    """What one save's planning can hand to the next: plans, metadata, and whether they were reused.

    ``cached_global_metadata`` is held by the coordinator only; ``loaded_all_plans`` are the local plans
    recorded in a previous checkpoint's metadata (``init_checkpoint_metadata_cache``).
    """

    def __init__(self) -> None:
        self.cached_central_plan: SavePlan | None = None
        self.cached_local_plan: SavePlan | None = None
        self.cached_global_metadata: Metadata | None = None
        self.validated_cache_reuse = False
        self.validated_loaded_metadata_reuse = False
        self.loaded_all_plans: list[SavePlan] | None = None
        self._prepared: _Prepared | None = None  # not NVRx's: the prepared path's fingerprint and template

    def set_cached_global_metadata(self, cached_global_metadata: Metadata) -> None:
        """Hold a previous checkpoint's metadata and the local plans it records (if any).

        Plans cached from earlier saves are dropped: they need not match this metadata.
        """
        self.cached_central_plan = self.cached_local_plan = None
        self.cached_global_metadata = cached_global_metadata
        self.loaded_all_plans = getattr(cached_global_metadata, "all_local_plans", None)
        if self.loaded_all_plans is None:
            logger.debug("metadata has no all_local_plans: its reuse cannot be verified")

    def set_cache_metadata(
        self, central_plan: SavePlan, local_plan: SavePlan | None, global_md_verify_reuse: bool
    ) -> None:
        """Record this save's plans; the plan counts as reused iff it equals the previous save's."""
        self.validated_loaded_metadata_reuse = global_md_verify_reuse
        self.validated_cache_reuse = self.cached_central_plan is not None and central_plan == self.cached_central_plan
        self.cached_central_plan = central_plan
        self.cached_local_plan = local_plan

    def prepare_save_state_dict_ret(
        self, rank: int, coordinator: int, save_state_dict_ret: SaveStateDictRet
    ) -> SaveStateDictRet:
        """Cache fresh metadata, or give the coordinator the cached metadata when planning reused it."""
        writer, metadata, dist_wrapper = save_state_dict_ret
        if metadata is not None:
            self.cached_global_metadata = metadata
        elif rank == coordinator:
            metadata = self.cached_global_metadata
        return writer, metadata, dist_wrapper

    def get_cache_metadata(self) -> tuple[SavePlan | None, SavePlan | None, bool, list[SavePlan] | None]:
        """(cached central plan, cached local plan, validated_cache_reuse, loaded_all_plans)."""
        return self.cached_central_plan, self.cached_local_plan, self.validated_cache_reuse, self.loaded_all_plans

    def get_metadata_caching_status(self) -> tuple[bool, bool]:
        """(validated_cache_reuse, validated_loaded_metadata_reuse) of the latest save."""
        return self.validated_cache_reuse, self.validated_loaded_metadata_reuse


_checkpoint_metadata_cache: CheckpointMetadataCache | None = None


def _module_cache() -> CheckpointMetadataCache:
    global _checkpoint_metadata_cache
    if _checkpoint_metadata_cache is None:
        _checkpoint_metadata_cache = CheckpointMetadataCache()
    return _checkpoint_metadata_cache


def init_checkpoint_metadata_cache(cached_global_metadata: Metadata) -> None:
    """Create the module's cache if needed and give it a previous checkpoint's metadata."""
    _module_cache().set_cached_global_metadata(cached_global_metadata)


def get_metadata_caching_status() -> tuple[bool, bool] | None:
    """The module cache's (validated_cache_reuse, validated_loaded_metadata_reuse), or None without one."""
    if _checkpoint_metadata_cache is None:
        return None
    return _checkpoint_metadata_cache.get_metadata_caching_status()


@paused_gc()
def save_state_dict_async_plan(
    state_dict: dict[str, Any],
    storage_writer: FileSystemWriterAsync,
    process_group: dist.ProcessGroup | None = None,
    coordinator_rank: int = 0,
    planner: SavePlanner | DefaultSavePlanner | None = None,
    enable_cache: bool = False,
    metadata_cache: CheckpointMetadataCache | None = None,
) -> SaveStateDictRet:
    """Plan the save on every rank (collective) and prepare ``storage_writer``'s write.

    Returns ``(storage_writer, metadata or None, dist_wrapper)``, to pass to ``save_state_dict_async_finalize``;
    only the coordinator holds the metadata. Raises CheckpointException on every rank if planning failed on any.
    """
    mark("plan")
    cache = (metadata_cache if metadata_cache is not None else _module_cache()) if enable_cache else None
    dist_wrapper = _DistWrapper(process_group, dist_ready(), coordinator_rank)
    planner = planner if planner is not None else DefaultSavePlanner()
    if cache is not None and cache.cached_central_plan is not None:
        buckets = _prepared_buckets(cache, state_dict, planner, storage_writer)
        agreed = _all_ranks_agree(buckets is not None, dist_wrapper)
        mark("agreed")
        if agreed:
            assert buckets is not None
            storage_writer.use_write_buckets(buckets)
            planner.finish_plan(cache.cached_central_plan)
            cache.validated_cache_reuse, cache.validated_loaded_metadata_reuse = True, False
            mark("planned")
            return cache.prepare_save_state_dict_ret(
                dist_wrapper.get_rank(), coordinator_rank, (storage_writer, None, dist_wrapper)
            )
    planner_settings = _planner_settings(planner)  # before set_up_planner adds its own attributes
    local_plan, local_error = _local_step(planner, storage_writer, state_dict, dist_wrapper.is_coordinator)
    central_plan, metadata, md_reused = _global_step(
        planner, storage_writer, local_plan, local_error, cache, dist_wrapper
    )
    central_plan = planner.finish_plan(central_plan)
    storage_writer.prepare_write_data(central_plan, planner)
    ret = (storage_writer, metadata, dist_wrapper)
    if cache is not None:
        cache.set_cache_metadata(central_plan, local_plan, md_reused)
        cache._prepared = _prepare_next(state_dict, planner, planner_settings, storage_writer)
        ret = cache.prepare_save_state_dict_ret(dist_wrapper.get_rank(), coordinator_rank, ret)
    mark("planned")
    return ret


def _check_saveable(value: object, key: str = "state_dict") -> None:
    """Refuse, before anything is written, a value that the writer could not serialize (it pickles non-tensors)."""
    if isinstance(value, dict):
        for k, v in value.items():
            _check_saveable(v, f"{key}[{k!r}]")
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_saveable(v, f"{key}[{i}]")
    elif not isinstance(value, torch.Tensor):
        try:
            pickle.dumps(value)
        except Exception as exc:
            raise ValueError(f"{key} cannot be saved: {type(value).__name__} is not picklable ({exc})") from exc


def _local_step(
    planner: SavePlanner, writer: FileSystemWriterAsync, state_dict: dict[str, Any], is_coordinator: bool
) -> tuple[SavePlan | None, BaseException | None]:
    try:
        _check_saveable(state_dict)
        planner.set_up_planner(state_dict, is_coordinator=is_coordinator)
        writer.set_up_storage_writer(is_coordinator)
        return writer.prepare_local_plan(planner.create_local_plan()), None
    except Exception as exc:
        return None, exc


def _global_step(
    planner: SavePlanner,
    writer: FileSystemWriterAsync,
    local_plan: SavePlan | None,
    local_error: BaseException | None,
    cache: CheckpointMetadataCache | None,
    dist_wrapper: _DistWrapper,
) -> tuple[SavePlan, Metadata | None, bool]:
    """(this rank's global plan, the metadata on the coordinator or None, whether loaded metadata is reused)."""
    if cache is not None and cache.cached_central_plan is not None:
        unchanged = local_error is None and local_plan == cache.cached_local_plan
        if _all_ranks_agree(unchanged, dist_wrapper):
            return cache.cached_central_plan, None, False
        cache.cached_central_plan = cache.cached_local_plan = None  # stale on every rank, so no rank reports reuse

    def own_plan() -> SavePlan:
        if local_error is not None:
            raise local_error
        assert local_plan is not None  # _local_step returns a plan or an error
        return local_plan

    if getattr(planner, "can_run_decentralized_global_plan", False) and getattr(
        writer, "can_run_decentralized_global_plan", False
    ):
        loaded = cache.loaded_all_plans if cache is not None else None
        md_reused = verify_global_md_reuse(loaded, local_plan, dist_wrapper.get_rank(), dist_wrapper)
        metadata = None if md_reused else _gather_metadata(planner, own_plan, dist_wrapper)
        # A Megatron-Core planner's method (its can_run_decentralized_global_plan says so), not SavePlanner's.
        decentralized = planner.create_decentralized_global_plan(local_plan)  # type: ignore[attr-defined]
        global_plan = writer.prepare_decentralized_global_plan(decentralized)
        return global_plan, metadata, md_reused

    built = {}

    def make_global_plans(all_plans: list[SavePlan]) -> list[SavePlan]:
        all_plans, built["metadata"] = planner.create_global_plan(all_plans)
        return writer.prepare_global_plan(all_plans)

    central_plan = dist_wrapper.reduce_scatter("plan", own_plan, make_global_plans)
    return central_plan, built.get("metadata"), False


def _gather_metadata(
    planner: SavePlanner, own_plan: Callable[[], SavePlan], dist_wrapper: _DistWrapper
) -> Metadata | None:
    """Gather the local plans; the coordinator builds the metadata, recording the plans in it."""
    built = {}

    def build(all_plans: list[SavePlan]) -> None:
        _, metadata = planner.create_global_plan(all_plans)
        metadata.all_local_plans = all_plans  # type: ignore[attr-defined]  # Megatron-Core's extra field
        built["metadata"] = metadata

    dist_wrapper.all_reduce("plan", own_plan, build)
    return built.get("metadata")


def verify_global_md_reuse(
    loaded_all_plans: list[SavePlan] | None, local_plan: SavePlan | None, rank: int, dist_wrapper: _DistWrapper
) -> bool:
    """True on every rank iff every rank's local plan equals its loaded plan in all fields but storage_data.

    False, without communicating, when there are no loaded plans or not one per rank.
    """
    if not loaded_all_plans or len(loaded_all_plans) != dist_wrapper.get_world_size():
        return False
    loaded = loaded_all_plans[rank]
    same = local_plan is not None and all(
        getattr(local_plan, f.name) == getattr(loaded, f.name) for f in fields(local_plan) if f.name != "storage_data"
    )
    return _all_ranks_agree(same, dist_wrapper)


def _all_ranks_agree(flag: bool, dist_wrapper: _DistWrapper) -> bool:
    """True iff ``flag`` is True on every rank of the wrapper's group (one MIN all-reduce of one int; none when the
    group has one rank)."""
    if not dist_wrapper.use_dist or dist_wrapper.get_world_size() == 1:
        return flag
    return bool(all_reduce([int(flag)], dist.ReduceOp.MIN, group=dist_wrapper.group)[0])


@paused_gc()
def save_state_dict_async_finalize(
    storage_writer: FileSystemWriterAsync, global_metadata: Metadata | None, dist_wrapper: _DistWrapper
) -> None:
    """Gather every rank's write results; if all succeeded, the coordinator commits the metadata.

    Collective. Raises CheckpointException on every rank if a write failed on any rank or the commit failed;
    no metadata is written then.
    """

    def commit(all_results: list[list[WriteResult]]) -> None:
        if global_metadata is None:
            raise RuntimeError("the coordinator has no metadata to commit (pass the plan step's return value)")
        storage_writer.finish(global_metadata, all_results)

    def commit_rows(all_rows: list[list[ResultRow]]) -> None:
        commit([results_of(rows) for rows in all_rows])

    mark("finalize")
    if type(storage_writer).retrieve_write_results is FileSystemWriterAsync.retrieve_write_results:
        # Each rank's results travel as plain rows (pickled and unpickled about 10x faster than the objects),
        # rebuilt on the coordinator alone; a writer that overrides retrieve_write_results is asked for objects.
        dist_wrapper.all_reduce("write", storage_writer.retrieve_write_rows, commit_rows)
    else:
        dist_wrapper.all_reduce("write", storage_writer.retrieve_write_results, commit)
    mark("finalized")


# ------------------------------------------------------------------------------------------ the prepared path


class _Prepared(NamedTuple):
    fingerprint: list[tuple[Any, ...]]
    planner_settings: tuple[Any, ...]
    template: WriteTemplate
    requires_grad: bool  # whether a tensor requires grad (the fingerprint holds it, so it holds for the next save)


class _Unprepared(Exception):
    """The state dict holds a value the prepared path does not handle: plan in full."""


_PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
_ALL_PLAIN = frozenset(_PLAIN_TENSORS)
# What the plan and .metadata depend on per tensor, read by one C call per tensor (a Python loop asking the five
# attributes costs 3x more: a state dict is mostly tensors, 10,000 a save).
_TENSOR_PRINT = attrgetter("shape", "dtype", "device", "requires_grad", "layout")
_LAYOUT = itemgetter(4)  # of a tensor print
_STRIDED = {torch.strided}


class _Walk(NamedTuple):
    values: list[Any]  # every value of the state dict, containers included, depth first
    prints: list[tuple[Any, ...]]  # per container of tensors only, one print; per other value its own
    paths: list[tuple[Any, ...]]  # per value: its path as torch's traversal makes it


def _walk(state_dict: dict[str, Any], expected: list[tuple[Any, ...]] | None = None) -> _Walk | None:
    """The state dict's values and fingerprint. With ``expected`` (a previous walk's prints), the values only,
    compared as they are met: None at the first difference (nothing kept per value, no paths made: the repeated
    save's cost). None also where the prepared path does not apply (a DTensor, a ShardedTensor, ...).

    A container whose values are all plain tensors (a module's parameters, an optimizer state's moments) has one
    print: its keys, their types and each tensor's shape, dtype, device, ``requires_grad`` and layout (and, on a
    machine with CUDA, whether a CPU tensor is pinned); any other value has its own: key, type and, for a tensor,
    the same properties."""
    values: list[Any] = []
    prints: list[tuple[Any, ...]] = []
    paths: list[tuple[Any, ...]] = []
    cuda = torch.cuda.is_available()  # without CUDA no tensor is pinned (asking costs about 1 us a tensor)
    met = 0  # prints met so far

    def note(print_: tuple[Any, ...]) -> None:
        nonlocal met
        if expected is None:
            prints.append(print_)
        elif met >= len(expected) or expected[met] != print_:
            raise _Unprepared
        met += 1

    def tensor_print(t: torch.Tensor) -> tuple[Any, ...]:
        shape, dtype, device, requires_grad, layout = _TENSOR_PRINT(t)
        if layout is not torch.strided:
            raise _Unprepared
        return (shape, dtype, device, requires_grad, cuda and device.type == "cpu" and t.is_pinned())

    def visit(path: tuple[Any, ...] | None, keys: list[Any], children: list[Any]) -> None:
        kinds = list(map(type, children))
        if kinds and _ALL_PLAIN.issuperset(kinds):  # tensors only: one print, each tensor read in one C call
            props = list(map(_TENSOR_PRINT, children))
            if set(map(_LAYOUT, props)) != _STRIDED:
                raise _Unprepared
            if cuda:
                props = [(*p, t.device.type == "cpu" and t.is_pinned()) for p, t in zip(props, children, strict=True)]
            note(("tensors", keys, kinds, props))
            values.extend(children)
            if path is not None:
                paths.extend((*path, key) for key in keys)
            return
        for key, value, kind in zip(keys, children, kinds, strict=True):
            values.append(value)
            at = None if path is None else (*path, key)
            if path is not None:
                paths.append(at)  # type: ignore[arg-type]  # a path whenever the walk makes paths
            if kind in _ALL_PLAIN:
                note((key, kind, *tensor_print(value)))
            elif isinstance(value, torch.Tensor) or hasattr(value, "__create_write_items__"):
                raise _Unprepared  # a DTensor, a ShardedTensor, or an object planning its own items
            elif isinstance(value, Mapping):
                note((key, kind, len(value)))
                visit(at, [str(k) for k in value], list(value.values()))
            elif kind is list or kind is tuple:
                note((key, kind, len(value)))
                visit(at, list(range(len(value))), list(value))
            else:
                note((key, kind))

    try:
        visit(() if expected is None else None, [str(k) for k in state_dict], list(state_dict.values()))
    except _Unprepared:
        return None
    if expected is not None and met != len(expected):
        return None
    return _Walk(values, prints, paths)


def _planner_settings(planner: SavePlanner) -> tuple[Any, ...]:
    """The planner's class and its flags (what its plan depends on besides the state dict)."""
    flags = sorted((k, v) for k, v in vars(planner).items() if isinstance(v, bool) and k != "is_coordinator")
    return (type(planner), *flags)


def _prepared_buckets(
    cache: CheckpointMetadataCache, state_dict: dict[str, Any], planner: SavePlanner, writer: FileSystemWriterAsync
) -> list[Any] | None:
    """The writer's buckets filled from the previous save's template, or None where this save must plan in full
    (no template, another structure or planner, the writer's path refused, a value that cannot be pickled)."""
    prepared = cache._prepared
    if prepared is None or cache.cached_local_plan is None:
        return None
    if not isinstance(planner, DefaultSavePlanner) or _planner_settings(planner) != prepared.planner_settings:
        return None  # (the template was made for DefaultSavePlanner itself: the check also narrows the type)
    walk = _walk(state_dict, prepared.fingerprint)
    mark("fingerprinted")
    if walk is None:
        return None
    try:
        writer.prepare_local_plan(cache.cached_local_plan)  # refuses a file or an existing checkpoint
        buckets = writer.prepared_buckets(
            prepared.template, walk.values, planner.transform_object, detach=prepared.requires_grad
        )
    except Exception:
        buckets = None  # the full path raises it on every rank
    mark("buckets")
    return buckets


def _prepare_next(
    state_dict: dict[str, Any], planner: SavePlanner, planner_settings: tuple[Any, ...], writer: FileSystemWriterAsync
) -> _Prepared | None:
    """What the next save with the same structure reuses, from this save's full plan (None if it cannot)."""
    mappings = getattr(planner, "mappings", None)
    # torch's own planner only: a subclass may resolve an item's data its own way
    if type(planner) is not DefaultSavePlanner or mappings is None or not writer.write_buckets:
        return None
    walk = _walk(state_dict)
    if walk is None:
        return None
    index = {path: i for i, path in enumerate(walk.paths)}
    if len(index) != len(walk.paths):
        return None  # two values with one path (keys equal as strings): torch refuses to flatten them

    def locate(item: WriteItem) -> int:
        at = index[mappings[item.index.fqn]]
        if item.type != WriteItemType.BYTE_IO:
            tensor, chunk = walk.values[at], item.tensor_data
            if type(tensor) not in _PLAIN_TENSORS or chunk is None or any(chunk.chunk.offsets):
                raise _Unprepared
            if tuple(chunk.chunk.sizes) != tuple(tensor.shape):
                raise _Unprepared
        return at

    try:
        template = writer.write_template(locate)
    except (_Unprepared, KeyError):
        return None
    requires_grad = any(type(v) in _ALL_PLAIN and v.requires_grad for v in walk.values)
    return _Prepared(walk.prints, planner_settings, template, requires_grad)
