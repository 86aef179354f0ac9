"""Which tests apply to the target under test: the skips of the spec plugin (registered by its pytest_configure).

A test is skipped, saying why, when
- it is marked `needs(capability, ...)` and the target lacks one (`target ... lacks <capability>: <what it is>`);
- it is marked `gpu` and the machine has no CUDA device, or its `tensor_device` mark asks for a device the run does
  not use (ckptspec.spec.harness.ranks.devices);
- it belongs to an area written against NVRx's module paths (releases.NVRX_AREAS) and the target maps none of them
  (its adapter's MODULES is empty: a protocol-layer target), before any fixture or rank starts;
- it, one of its fixtures or a rank body asks the target for a module or feature the adapter does not provide
  (MissingCapability): "not applicable", as docs/adding-a-target.md promises, never an error charged to the target.
"""

from __future__ import annotations

from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from ckptspec.report import releases
from ckptspec.spec.harness.ranks import devices
from ckptspec.spec.harness.surface.loading import CAPABILITY_DOCS, MissingCapability, current_target

__all__ = ["nvrx_area", "pytest_fixture_setup", "pytest_pyfunc_call", "pytest_runtest_setup"]


def nvrx_area(item: pytest.Item) -> str | None:
    """The area of a test of ckptspec/spec/ written against NVRx's module paths (releases.NVRX_AREAS), or None."""
    parts = Path(str(item.path)).resolve().relative_to(Path(str(item.config.rootpath)).resolve()).parts
    if len(parts) > 3 and parts[:2] == ("ckptspec", "spec") and parts[2] in releases.NVRX_AREAS:
        return parts[2]
    return None


def pytest_runtest_setup(item: pytest.Item) -> None:
    target = current_target()  # the plugin resolved it and wrote its name to the environment
    if not target.adapter.MODULES and (area := nvrx_area(item)):
        pytest.skip(f"not applicable: target {target.name!r} maps no NVRx module path, the {area} area's subject")
    for mark in item.iter_markers("needs"):
        missing = [c for c in mark.args if not target.has(c)]
        if missing:
            docs = "; ".join(f"{c}: {CAPABILITY_DOCS[c]}" for c in missing)
            pytest.skip(f"target {target.name!r} lacks {docs}")
    if item.get_closest_marker("gpu"):
        import torch

        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device; this machine has none")
    if reason := devices.skip_reason(item):
        pytest.skip(reason)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Generator[None, object, object]:
    """A test body that asks the target for what it lacks is not applicable (rank bodies: the rank runners)."""
    try:
        return (yield)
    except MissingCapability as exc:
        pytest.skip(f"not applicable: {exc}")


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any]) -> Generator[None, object, object]:
    """The same for a fixture (the `core` fixture of a target without async_ckpt.core)."""
    try:
        return (yield)
    except MissingCapability as exc:
        pytest.skip(f"not applicable: {exc}")
