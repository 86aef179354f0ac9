"""The save benchmark's checks hold on any device and any supported torch (CPU tests of GPU-node failures).

- The snapshot check compares values, not devices: a `torch.save` file written from CUDA tensors (Megatron-Core's
  queue saves what it is given) is loaded onto the CPU and compared there (H100 run of 2026-11-27:
  `test_stall[torch:mcore]` crashed comparing a CUDA tensor with a CPU one).
- The DCP staged peers keep their DefaultStager across saves where torch allows it, and where a torch release
  closes it after each save (torch 2.11, issue 183413) they take a fresh one per save and say so; the release's
  behaviour is reproduced here by closing the stager in a done callback of the upload, as torch 2.11 does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.serialization
from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

from benchmarks.dcp_stager import FRESH_NOTE, KeptStager
from benchmarks.peers import make_peer
from benchmarks.workload import make_state_dict, negate_, saved_before_update

SMALL = 64 * 1024  # the smallest state dict make_state_dict builds


@pytest.fixture
def storages_tagged_cuda() -> Iterator[None]:
    """torch.save tags every storage `cuda:0`, as a save of CUDA tensors does (a CPU machine has none to save)."""
    entry = (1, lambda storage: "cuda:0", lambda storage, location: None)
    torch.serialization._package_registry.append(entry)
    torch.serialization._package_registry.sort(key=lambda e: e[0])
    try:
        yield
    finally:
        torch.serialization._package_registry.remove(entry)


def test_a_torch_file_written_from_cuda_tensors_is_checked_on_the_cpu(tmp_path: Path, request) -> None:
    state = make_state_dict(SMALL, "cuda" if torch.cuda.is_available() else "cpu")
    path = str(tmp_path / "ckpt.pt")
    if torch.cuda.is_available():
        torch.save(state, path)
    else:
        request.getfixturevalue("storages_tagged_cuda")
        torch.save(state, path)
        with pytest.raises(RuntimeError, match="CUDA"):  # the file does name a CUDA device
            torch.load(path, weights_only=True)
    negate_(state)
    assert saved_before_update("torch", path, state), "the saved values were not recognised"
    negate_(state)
    assert not saved_before_update("torch", path, state), "the check passes values that were never saved"


def _closes_given_stagers(monkeypatch: pytest.MonkeyPatch) -> None:
    real = dcp.async_save

    def async_save(*args, async_stager=None, **kwargs):
        response = real(*args, async_stager=async_stager, **kwargs)
        upload = response.upload_completion if isinstance(response, AsyncSaveResponse) else response
        if async_stager is not None:
            upload.add_done_callback(lambda _: async_stager.close())
        return response

    monkeypatch.setattr(dcp, "async_save", async_save)


@pytest.mark.parametrize("closes", [False, True], ids=["stager-kept", "stager-closed-by-torch"])
def test_the_staged_peer_saves_correctly_whether_or_not_torch_closes_its_stager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closes: bool
) -> None:
    if closes:
        _closes_given_stagers(monkeypatch)
    peer = make_peer("dcp:async_save-staged")
    state = make_state_dict(SMALL)
    try:
        for save in range(3):
            path = str(tmp_path / f"save{save}")
            peer.save(state, path)
            peer.before_update()
            negate_(state)
            peer.wait()
            assert saved_before_update("dcp", path, state), f"save {save} does not hold the values of its call"
        stager = peer._stager  # type: ignore[attr-defined]
        assert isinstance(stager, KeptStager)
        assert stager.saves == (3 if closes else 1), f"stagers made for 3 saves: {stager.saves}"
        assert peer.note == (FRESH_NOTE.format(version=torch.__version__) if closes else None)
    finally:
        peer.close()
