"""Where ckptspec runs from: a checkout of this repository, or an installed copy (`pip install ckptspec`).

In a checkout the repository root holds `pyproject.toml`, whose `[tool.pytest.ini_options]` and `[tool.ckptspec]`
configure every run, and the data the commands read (`findings/advice.toml`, the stored runs `conformance/all/`).
An installed copy has the package `ckptspec` in site-packages and none of these, so the wheel carries them:
`ckptspec/spec/harness/installed.toml`, the pytest configuration of an installed run, and under
`ckptspec/report/data/` the usage rules and the stored runs. This module says which case holds and gives the paths
and pytest options of each:

- `ROOT`: the directory holding the `ckptspec` package (the checkout, or site-packages): every run's rootdir, so
  that node ids read `ckptspec/spec/...` in both cases and the expectations files match them.
- `CHECKOUT`: whether ROOT is a checkout.
- `CONFIG`: the TOML file of the run options (`[tool.ckptspec]`) and the pytest configuration.
- `pytest_options()`: what a pytest command started by ckptspec adds so that an installed copy runs as a
  checkout does (`-c installed.toml --rootdir ROOT`); nothing in a checkout.
- `data_file(relative)`: a data file or directory by its path in the checkout (`findings/advice.toml`,
  `conformance/all`), wherever it lies.

Standard library only: `ckptspec report` imports this without torch.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CHECKOUT", "CONFIG", "INSTALLED_CONFIG", "ROOT", "data_file", "pytest_options"]

ROOT = Path(__file__).resolve().parents[2]
CHECKOUT = (ROOT / "pyproject.toml").is_file() and (ROOT / "regenerate.py").is_file()
INSTALLED_CONFIG = Path(__file__).resolve().parents[1] / "spec" / "harness" / "installed.toml"
"""The pytest configuration of an installed copy; harness_tests/test_packaging.py keeps it in step with pyproject."""
CONFIG = ROOT / "pyproject.toml" if CHECKOUT else INSTALLED_CONFIG
# Data files an installed copy carries under the harness package, by their path in the checkout.
_PACKAGED = {
    "findings/advice.toml": Path(__file__).with_name("data") / "advice.toml",
    "conformance/all": Path(__file__).with_name("data") / "stored",
}


def pytest_options(*, anywhere: bool = False) -> list[str]:
    """Options of a pytest the harness starts in ROOT: none in a checkout; the packaged config and the rootdir in an
    installed copy. `anywhere`: for a pytest started in any directory (`ckptspec pytest`), both in either case."""
    if CHECKOUT and not anywhere:
        return []
    return ["-c", str(CONFIG), "--rootdir", str(ROOT)]


def data_file(relative: str) -> Path:
    """The data file at `relative` in a checkout, or the copy an installed package carries of it."""
    if CHECKOUT or relative not in _PACKAGED:
        return ROOT / relative
    return _PACKAGED[relative]
