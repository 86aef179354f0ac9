"""Names and parameters documented for the storage path, at their documented module paths."""

import inspect
from typing import Any

import pytest
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.storage import StorageWriter

pytestmark = pytest.mark.needs("storage_writer")
EMPTY = inspect.Parameter.empty
ANY = object()  # the documents show no default: any (or none) is fine

# module -> name -> (method or None for the callable itself) -> [(parameter, default, EMPTY or ANY)]
MANIFEST: dict[str, dict[str, dict[str | None, list[tuple[str, Any]]]]] = {
    "async_ckpt.filesystem_async": {
        "FileSystemWriterAsync": {
            "prepare_write_data": [("plan", EMPTY), ("planner", EMPTY)],
            "get_save_function_and_args": [],
            "preload_tensors": [("write_buckets", EMPTY), ("non_blocking", True)],
            "retrieve_write_results": [],
            "finish": [("metadata", EMPTY), ("results", EMPTY)],
            "prepare_decentralized_global_plan": [("local_plan", EMPTY)],
        },
    },
    "async_ckpt.state_dict_saver": {
        "save_state_dict_async_plan": {
            None: [
                ("state_dict", EMPTY),
                ("storage_writer", EMPTY),
                ("process_group", None),
                ("coordinator_rank", 0),
                ("planner", None),
                ("enable_cache", False),
                ("metadata_cache", None),
            ]
        },
        "save_state_dict_async_finalize": {
            None: [("storage_writer", EMPTY), ("global_metadata", EMPTY), ("dist_wrapper", EMPTY)]
        },
        "verify_global_md_reuse": {
            None: [("loaded_all_plans", EMPTY), ("local_plan", EMPTY), ("rank", EMPTY), ("dist_wrapper", EMPTY)]
        },
        "init_checkpoint_metadata_cache": {None: [("cached_global_metadata", ANY)]},
        "get_metadata_caching_status": {None: []},
        "CheckpointMetadataCache": {
            "set_cached_global_metadata": [("cached_global_metadata", EMPTY)],
            "set_cache_metadata": [("central_plan", EMPTY), ("local_plan", EMPTY), ("global_md_verify_reuse", EMPTY)],
            "prepare_save_state_dict_ret": [("rank", EMPTY), ("coordinator", EMPTY), ("save_state_dict_ret", EMPTY)],
            "get_cache_metadata": [],
            "get_metadata_caching_status": [],
        },
    },
    "async_ckpt.cached_metadata_filesystem_reader": {
        "CachedMetadataFileSystemReader": {"__init__": [("path", EMPTY)], "read_metadata": []},
    },
}
CASES = [
    pytest.param(mod, name, member, params, id=f"{mod}.{name}.{member or 'call'}")
    for mod, names in MANIFEST.items()
    for name, members in names.items()
    for member, params in members.items()
]


@pytest.mark.spec("FS-17")
@pytest.mark.parametrize(("module", "name", "member", "params"), CASES)
def test_documented_callable_exists_with_its_parameters(target, module, name, member, params):
    obj = getattr(target.module(module), name, None)
    assert obj is not None, f"{module} has no {name}"
    fn = obj if member is None else getattr(obj, member, None)
    assert callable(fn), f"{name}.{member} is missing"
    sig = inspect.signature(fn)
    for param, default in params:
        assert param in sig.parameters, f"{name}.{member or ''}{sig} has no parameter {param!r}"
        actual = sig.parameters[param].default
        assert default is ANY or actual == default, (
            f"{name}.{member or ''}: {param} defaults to {actual!r}, but should be {default!r}"
        )


@pytest.mark.spec("FS-1", "FS-17")
def test_the_writer_is_a_storage_writer_taking_the_documented_keywords(target, tmp_path):
    cls = target.module("async_ckpt.filesystem_async").FileSystemWriterAsync
    assert issubclass(cls, StorageWriter), f"FileSystemWriterAsync derives from {cls.__mro__}, not StorageWriter"
    writer = cls(str(tmp_path / "ckpt"), thread_count=2, separation_hint="opt", use_msc=False)
    assert isinstance(writer, StorageWriter)
    reader = target.module("async_ckpt.cached_metadata_filesystem_reader").CachedMetadataFileSystemReader
    assert issubclass(reader, FileSystemReader), f"CachedMetadataFileSystemReader derives from {reader.__mro__}"


def _preloaded(path: str) -> dict[str, dict]:
    """Plan a save of two CPU tensors and stage it with preload_tensors, for each non_blocking: (device, values) of
    every staged tensor, and of the state dict's."""
    import torch

    from spec_tests.drivers import saving

    state = {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(4, dtype=torch.int64)}
    writer = saving.module("filesystem_async").FileSystemWriterAsync(path)
    saving.plan(state, writer)
    _, preload_fn, args = writer.get_save_function_and_args()
    # Each release is called as its docstring says: 0.4.1 (and impl) preload_tensors(write_buckets, non_blocking)
    # with the buckets in args; 0.7.0 preload_tensors(resolved_plan_data, non_blocking), that argument bound in
    # preload_fn and args[1] None.
    source = args[1] if args[1] is not None else preload_fn.args[0]
    staged = {}
    for non_blocking in (True, False):
        out = type(writer).preload_tensors(source, non_blocking=non_blocking)
        staged[str(non_blocking)] = sorted(((t.device.type, t.tolist()) for b in out for _, t in b[2][1]), key=str)
    expected = sorted((("cpu", t.tolist()) for t in state.values()), key=str)
    return {"staged": staged, "expected": {"True": expected, "False": expected}}


@pytest.mark.spec("FS-19")
def test_preload_tensors_stages_every_tensor_to_host_memory(tmp_path):
    from spec_tests.harness.ranks import run_on_ranks

    result = run_on_ranks(_preloaded, 1, (str(tmp_path / "c"),), timeout=120)[0]
    assert result["staged"] == result["expected"], (
        f"preload_tensors(...) on CPU tensors, per non_blocking: (device, values) of the staged tensors "
        f"{result['staged']}, but should be {result['expected']}"
    )
