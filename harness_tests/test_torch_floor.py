"""The session header says when the installed torch is older than the one the suite supports (pyproject.toml)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
import torch

from ckptspec.spec.harness.surface.loading import SUPPORTED_TORCH, torch_below_supported


def test_the_supported_torch_gets_no_warning() -> None:
    assert torch_below_supported() is None, f"torch {torch.__version__} is the one the suite is tested with"


def test_an_older_torch_is_named_in_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch, "__version__", "2.10.0+cu128")
    line = torch_below_supported()
    assert line is not None
    assert "torch 2.10.0+cu128 is older than 2.11" in line


def test_the_gpu_nodes_torch_is_supported(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch 2.11, the torch of the H100 nodes' containers, is the floor (the nox sessions torch(2.11) ...)."""
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    assert torch_below_supported() is None


def test_the_floor_is_pyproject_tomls() -> None:
    project = tomllib.loads((Path(__file__).resolve().parent.parent / "pyproject.toml").read_text())["project"]
    assert f"torch>={SUPPORTED_TORCH}" in project["optional-dependencies"]["test"]
