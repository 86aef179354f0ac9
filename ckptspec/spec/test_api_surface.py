"""Names and parameters documented for the async core, at their documented module paths (API-1); every public name
of NVRx's releases in a target that mirrors NVRx, or listed as left out (API-2). Both read one manifest,
ckptspec/spec/nvrx_api.toml, and judge a name's presence one way (ckptspec.spec.nvrx_api)."""

import importlib
import importlib.util
import re
from pathlib import Path

import pytest

from ckptspec.spec.harness.surface.loading import MissingCapability
from ckptspec.spec.nvrx_api import RELEASED, check_documented, documented_cases, has_name, names_of


@pytest.mark.spec("API-1")
@pytest.mark.parametrize(("module", "cls", "method", "params"), documented_cases("API-1"))
def test_documented_method_exists_with_its_parameters(target, module, cls, method, params):
    try:
        mod = target.module(module)
    except MissingCapability as exc:
        pytest.skip(str(exc))
    check_documented(mod, cls, method, params)


WHOLE_MODULE = "(module)"


def _mirror(target) -> tuple[str, dict[tuple[str, str], str]]:
    """The target's package that mirrors NVRx, and its left-out table: (module, name) -> the reason."""
    package, page = getattr(target.adapter, "NVRX_MIRROR", None), getattr(target.adapter, "NVRX_LEFT_OUT", None)
    if package is None or page is None:
        pytest.skip(f"target {target.name!r} does not mirror NVRx's modules (no NVRX_MIRROR in its adapter)")
    text = Path(page).read_text()
    table = text.split("<!-- left-out:start -->")[1].split("<!-- left-out:end -->")[0]
    left_out = {}
    for row in table.strip().splitlines()[2:]:
        module, names, _, why = (cell.strip() for cell in row.strip().strip("|").split("|"))
        for name in re.findall(r"`([^`]+)`", names):
            left_out[(module.strip("`"), name)] = why
    return package, left_out


def _present(package: str, module: str, name: str) -> bool:
    if name == WHOLE_MODULE:
        return importlib.util.find_spec(f"{package}.{module}") is not None
    return has_name(importlib.import_module(f"{package}.{module}"), name)


@pytest.mark.spec("API-2")
@pytest.mark.parametrize(
    ("release", "module"), [pytest.param(r, m, id=f"{r}:{m or '.'}") for r, mods in RELEASED.items() for m in mods]
)
def test_every_public_name_of_nvrx_is_there_or_left_out(target, release, module):
    package, left_out = _mirror(target)
    if (module, WHOLE_MODULE) in left_out:
        return
    mod = importlib.import_module(f"{package}.{module}" if module else package)
    absent = [
        n
        for n in names_of(RELEASED[release][module])
        if not has_name(mod, n) and (module, n) not in left_out and (module, n.partition(".")[0]) not in left_out
    ]  # a class left out leaves out its attributes
    assert not absent, (
        f"{mod.__name__} lacks NVRx {release}'s public names {absent}: add them with NVRx's meaning, or list them "
        "in docs/impl.md's left-out table with the reason"
    )


@pytest.mark.spec("API-2")
def test_every_name_left_out_is_an_nvrx_name_the_target_lacks(target):
    package, left_out = _mirror(target)
    known = {(m, n) for mods in RELEASED.values() for m, names in mods.items() for n in names_of(names)}
    known |= {(m, WHOLE_MODULE) for mods in RELEASED.values() for m in mods}
    stale = sorted(k for k in left_out if k not in known)
    assert not stale, f"docs/impl.md leaves out {stale}, which no NVRx release in the manifest has"
    present = [(m, n) for m, n in left_out if _present(package, m, n)]
    assert not present, f"docs/impl.md leaves out {present}, which {package} has: remove them from its table"
