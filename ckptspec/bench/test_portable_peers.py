"""The save benchmark's checks hold on any device and any supported torch (CPU tests of GPU-node failures).

- The snapshot check compares values, not devices: a `torch.save` file written from CUDA tensors (Megatron-Core's
  queue saves what it is given) is loaded onto the CPU and compared there (H100 run of 2026-11-27:
  `test_stall[torch:mcore]` crashed comparing a CUDA tensor with a CPU one).
- The DCP staged peers keep their DefaultStager across saves where torch allows it, and where a release's
  DefaultStager cannot stage twice (torch 2.11, issue 183413) they take a fresh one per save and say so; that
  release's behaviour is reproduced here by closing the copier at the end of every stage, as torch 2.11 does.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.serialization
from torch.distributed.checkpoint.staging import DefaultStager

from ckptspec.bench.dcp_stager import FRESH_NOTE, KeptStager, stager_reusable
from ckptspec.bench.peers import make_peer
from ckptspec.bench.workload import make_state_dict, negate_, saved_before_update

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


def _stagers_close_after_each_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    """What torch 2.11's DefaultStager does: it closes its copier at the end of every stage()."""
    real = DefaultStager._stage

    def stage_then_close(self, state_dict, **kwargs):
        staged = real(self, state_dict, **kwargs)
        self._state_dict_stager.close()
        return staged

    monkeypatch.setattr(DefaultStager, "_stage", stage_then_close)
    stager_reusable.cache_clear()  # asked again of the patched stager; cleared again after the test


@pytest.mark.parametrize("closes", [False, True], ids=["stager-kept", "stager-closed-after-each-stage"])
def test_the_staged_peer_saves_correctly_whether_or_not_torch_can_reuse_its_stager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, closes: bool
) -> None:
    if closes:
        _stagers_close_after_each_stage(monkeypatch)
    reusable = stager_reusable()
    if closes:
        assert not reusable, "the probe missed a stager that cannot stage twice"
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
        assert stager.made == (1 if reusable else 3), f"stagers made for 3 saves: {stager.made}"
        assert peer.note == (None if reusable else FRESH_NOTE.format(version=torch.__version__))
    finally:
        peer.close()
        stager_reusable.cache_clear()
