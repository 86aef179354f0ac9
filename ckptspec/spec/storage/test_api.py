"""Names and parameters documented for the storage path, at their documented module paths (the manifest:
ckptspec/spec/nvrx_api.toml, FS-17)."""

import pytest
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.storage import StorageWriter

from ckptspec.spec.nvrx_api import check_documented, documented_cases

pytestmark = pytest.mark.needs("storage_writer")


@pytest.mark.spec("FS-17")
@pytest.mark.parametrize(("module", "name", "member", "params"), documented_cases("FS-17"))
def test_documented_callable_exists_with_its_parameters(target, module, name, member, params):
    check_documented(target.module(module), name, member, params)


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

    from ckptspec.spec.drivers import saving

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
    from ckptspec.spec.harness.ranks import run_on_ranks

    result = run_on_ranks(_preloaded, 1, (str(tmp_path / "c"),), timeout=120)[0]
    assert result["staged"] == result["expected"], (
        f"preload_tensors(...) on CPU tensors, per non_blocking: (device, values) of the staged tensors "
        f"{result['staged']}, but should be {result['expected']}"
    )
