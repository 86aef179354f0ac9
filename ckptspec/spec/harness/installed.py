"""Where the suite runs from: a checkout of this repository, or an installed copy (`pip install ckptspec`).

In a checkout the repository root holds `pyproject.toml`, whose `[tool.pytest.ini_options]` and `[tool.ckptspec]`
configure every run, and the data the commands read (`findings/advice.toml`). An installed copy has the packages
(`ckptspec/spec`, `ckptspec/faults`, `benchmarks`, `impl`) side by side in site-packages and neither file, so the wheel
carries both inside the harness package: `installed.toml`, the pytest configuration of an installed run, and
`data/advice.toml`. This module says which case holds and gives the paths and pytest options of each:

- `ROOT`: the directory holding the `ckptspec/spec` package (the checkout, or site-packages): every run's rootdir, so
  that node ids read `ckptspec/spec/...` in both cases and the expectations files match them.
- `CHECKOUT`: whether ROOT is a checkout.
- `CONFIG`: the TOML file of the run options (`[tool.ckptspec]`) and the pytest configuration.
- `pytest_options()`: what a pytest command started by the harness adds so that an installed copy runs as a
  checkout does (`-c installed.toml --rootdir ROOT`); nothing in a checkout.
- `data_file(relative)`: a data file by its path in the checkout (`findings/advice.toml`), wherever it lies.

Standard library only: `ckptspec report` imports this without torch.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CHECKOUT", "CONFIG", "INSTALLED_CONFIG", "ROOT", "data_file", "pytest_options"]

ROOT = Path(__file__).resolve().parents[3]
CHECKOUT = (ROOT / "pyproject.toml").is_file() and (ROOT / "regenerate.py").is_file()
INSTALLED_CONFIG = Path(__file__).with_name("installed.toml")
"""The pytest configuration of an installed copy; harness_tests/test_packaging.py keeps it in step with pyproject."""
CONFIG = ROOT / "pyproject.toml" if CHECKOUT else INSTALLED_CONFIG
# Data files an installed copy carries under the harness package, by their path in the checkout.
_PACKAGED = {"findings/advice.toml": Path(__file__).with_name("data") / "advice.toml"}


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
