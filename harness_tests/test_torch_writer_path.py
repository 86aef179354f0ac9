"""FS-18 on the path torch's synchronous writer takes on a machine with an accelerator, pinned on a CPU-only one.

With one thread, torch's `FileSystemWriter` stages a file's tensors through `_OverlappingCpuLoader` when CUDA (or
the PrivateUse1 device) is available, and that loader writes them smallest first; without one, `_SerialCpuLoader`
keeps the plan's order (`torch.distributed.checkpoint.filesystem._write_files_from_queue`, torch 2.11 to 2.15). The
H100 runs of 2026-11-27 failed FS-18 for that reason: impl wrote the plan's order. Here both writers are made to
take the accelerator path on CPU tensors, and impl's files must still be torch's, byte for byte.

- `cuda`: `torch.cuda.is_available()` says True, and the loader's stream calls go to a stand-in of host no-ops
  (its tensors are on the CPU, so it orders and copies them as on a CUDA machine, with nothing to copy to the host).
- `privateuse1`: a device module registered under the PrivateUse1 backend's name, as an out-of-tree backend does.
"""

from __future__ import annotations

import contextlib
import os
from unittest import mock

import pytest
import torch
from torch.distributed.checkpoint import FileSystemWriter, state_dict_saver
from torch.distributed.checkpoint import filesystem as torch_filesystem
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from ckptspec.spec.drivers import saving
from ckptspec.spec.harness.ranks import run_on_ranks


class _HostStream:
    """The stream calls `_OverlappingCpuLoader` makes, as no-ops: there is nothing to wait for on the host."""

    def synchronize(self) -> None:
        pass

    def wait_stream(self, other: object) -> None:
        pass


class _HostDevice:
    """A device module for the loader: available, one current stream, a stream context that does nothing."""

    _current = _HostStream()

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def current_stream(*args: object) -> _HostStream:
        return _HostDevice._current

    @staticmethod
    def stream(stream: object) -> contextlib.AbstractContextManager[None]:
        return contextlib.nullcontext()


@contextlib.contextmanager
def _accelerator_path(kind: str):
    """torch's writer (and whatever asks torch what it would do) sees an available accelerator of `kind`."""
    if kind == "cuda":
        with (
            mock.patch.object(torch.cuda, "is_available", return_value=True),
            mock.patch.object(torch_filesystem, "_get_device_module", return_value=_HostDevice),
        ):
            yield
    else:
        name = torch._C._get_privateuse1_backend_name()
        assert not hasattr(torch, name), f"torch.{name} exists already: a PrivateUse1 backend is installed"
        setattr(torch, name, _HostDevice)
        try:
            yield
        finally:
            delattr(torch, name)


def _state() -> dict:
    """Tensors largest first in the plan (so the two orders differ), a view of a larger storage, and items that are
    pickled (BYTE_IO)."""
    return {
        "big": torch.arange(300.0),
        "mid": torch.arange(40, dtype=torch.float64),
        "view": torch.arange(64.0)[8:24],
        "small": torch.arange(3, dtype=torch.int16),
        "step": 7,
        "names": ["a", "b"],
    }


def _files(directory: str) -> dict[str, bytes]:
    out = {}
    for name in saving.data_files(directory):
        with open(os.path.join(directory, name), "rb") as f:
            out[name] = f.read()
    return {name: data for name, data in out.items() if data}


def _both_writers(base: str, kind: str) -> tuple[list[str], int]:
    """impl's async save and torch's synchronous one, with one thread, both on the accelerator path."""
    mine, theirs = os.path.join(base, "async"), os.path.join(base, "sync")
    made = []
    real_loader = torch_filesystem._OverlappingCpuLoader

    def counted(*args, **kwargs):
        made.append(1)
        return real_loader(*args, **kwargs)

    with _accelerator_path(kind), mock.patch.object(torch_filesystem, "_OverlappingCpuLoader", counted):
        saving.async_save(_state(), mine, persistent=None, thread_count=1)
        state_dict_saver.save(
            _state(), storage_writer=FileSystemWriter(theirs, thread_count=1), planner=DefaultSavePlanner()
        )
    found = []
    if saving.read_metadata(mine).storage_data != saving.read_metadata(theirs).storage_data:
        found.append("metadata.storage_data differs (file, offset or length of an item)")
    ours, torchs = _files(mine), _files(theirs)
    if sorted(ours) != sorted(torchs):
        found.append(f"non-empty data files {sorted(ours)}, torch's {sorted(torchs)}")
    found += [f"{name} is not byte-identical to torch's" for name in sorted(ours) if ours[name] != torchs.get(name)]
    return found, len(made)


@pytest.mark.parametrize("kind", ["cuda", "privateuse1"])
def test_impl_writes_what_torchs_writer_writes_on_an_accelerator_machine(tmp_path, kind):
    ((found, loaders),) = run_on_ranks(_both_writers, 1, (str(tmp_path), kind), timeout=120)
    assert loaders == 1, f"torch's writer made {loaders} _OverlappingCpuLoader(s), not the one of its only file"
    assert not found, f"on the {kind} path, impl's one-thread save differs from torch's: {'; '.join(found)}"
