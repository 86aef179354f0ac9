"""IN-2's "naming the damaged file" as each torch release lets a reader name it (ckptspec/spec/drivers/damage.py).

torch 2.11's dcp.load catches what `read_metadata` raises and raises `AssertionError("metadata is None")` in its
place; 2.13 and later add the reader's error to that text. The H100 runs (torch 2.11) failed IN-2's .metadata damages
for that reason. The probe asks the installed torch which it does; here it also meets a dcp.load that behaves as
2.11's, so both texts are checked on whichever torch runs this.
"""

from __future__ import annotations

import traceback

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from ckptspec.spec.drivers import damage

PATH = "/ckpt/iter_0000010/.metadata"


def _load_as_in_2_11(state_dict, *, storage_reader, **kwargs):
    """torch 2.11's dcp.load when no metadata can be read: the reader's errors logged and dropped."""
    for call in (storage_reader.read_metadata, lambda: storage_reader.read_metadata(rank=0)):
        try:
            call()
        except Exception:  # 2.11 logs it at INFO and goes on
            continue
    error = AssertionError("metadata is None")
    raise CheckpointException("CheckpointException ranks:dict_keys([0])", {0: (error, traceback.StackSummary())})


@pytest.fixture
def fresh_probe():
    damage.metadata_error_text.cache_clear()
    yield
    damage.metadata_error_text.cache_clear()


@pytest.mark.usefixtures("fresh_probe")
def test_a_torch_that_drops_the_readers_error_is_told_by_its_own_text(monkeypatch):
    monkeypatch.setattr(dcp, "load", _load_as_in_2_11)
    assert damage.metadata_error_text() == "AssertionError: metadata is None"
    said = "CheckpointException ranks:dict_keys([0])\nTraceback ...\nAssertionError: metadata is None\n"
    assert damage.names_file(said, ".metadata")
    assert damage.torch_replaced_it(said, ".metadata")
    assert not damage.names_file(said, "__0_0.distcp"), "a data file is never named by torch's text"
    assert not damage.names_file("RuntimeError: some other failure", ".metadata")


@pytest.mark.usefixtures("fresh_probe")
def test_a_torch_that_keeps_the_readers_error_must_show_the_name(monkeypatch):
    def load_keeping_it(state_dict, *, storage_reader, **kwargs):
        try:
            storage_reader.read_metadata()
        except Exception as exc:
            raise AssertionError(f"metadata is None; global metadata read failed: {exc}") from exc

    monkeypatch.setattr(dcp, "load", load_keeping_it)
    assert damage.metadata_error_text() is None
    assert damage.names_file(f"AssertionError: metadata is None; global metadata read failed: {PATH}: bad", ".metadata")
    assert not damage.names_file("AssertionError: metadata is None", ".metadata"), "torch could have named it"
    assert not damage.names_file("rank local metadata read failed: /ckpt/__0.metadata", ".metadata")


@pytest.mark.usefixtures("fresh_probe")
def test_the_installed_torch_answers_the_probe():
    """Whichever the installed torch is, the probe gets an answer (dcp.load raises for unreadable metadata)."""
    text = damage.metadata_error_text()
    assert text is None or "metadata is None" in text, text
