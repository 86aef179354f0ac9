"""The release as pip installs it (issue 51 item 1): the wheel carries every runnable part, and an installed copy
runs without the checkout.

One wheel is built per session from a copy of the packaged directories (so the build leaves nothing in the
checkout), then:

- it installs one top-level name, `ckptspec` (issue 59), and its file list holds every tracked module of it (the
  spec, the fault suite, the benchmarks, impl and the command), every clause, expectations and API file, the
  installed copy's pytest configuration, the usage rules (`findings/advice.toml`, same bytes) and the benchmark
  baseline;
- its metadata has pyproject's version, its URLs and the `ckptspec` command;
- installed into a directory of its own (`pip install --target`) and started from elsewhere, it knows it is not a
  checkout, reads the usage rules, and collects the protocol tests by `--pyargs` under their checkout node ids;
  started from a directory with packages of its own named `benchmarks` and `impl` (as a library's repository has),
  `python -m ckptspec` and `python -m ckptspec.bench.regression` are still ours.

And the installed copy's configuration (ckptspec/spec/harness/installed.toml) says what pyproject.toml says.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from ckptspec.cli import version
from ckptspec.report import installed
from harness_tests.pytest_runs import REPO_ROOT, clean_env

PACKAGES = ("ckptspec",)
PYPROJECT = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())
# The pytest settings an installed copy drops: its packages are importable where they lie, and it is given paths.
CHECKOUT_ONLY = {"testpaths", "pythonpath"}


def _tracked(*patterns: str) -> list[str]:
    done = subprocess.run(["git", "ls-files", *patterns], cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    return done.stdout.split()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md", "LICENSE", "findings/advice.toml"):
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(REPO_ROOT / name, source / name)
    shutil.copytree(REPO_ROOT / "conformance" / "all", source / "conformance" / "all")  # the stored runs' link
    for package in PACKAGES:
        ignore = shutil.ignore_patterns("__pycache__", "results")
        shutil.copytree(REPO_ROOT / package, source / package, symlinks=True, ignore=ignore)
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(source)]
    subprocess.run([*command, "-w", str(out)], cwd=source, check=True, timeout=300, capture_output=True)
    (built,) = out.glob("ckptspec-*.whl")
    return built


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_wheel_holds_every_module_of_the_runnable_packages(wheel):
    modules = _tracked(*(f"{p}/*.py" for p in PACKAGES))
    assert len(modules) > 100, "git ls-files found too few modules to check"
    missing = sorted(set(modules) - _names(wheel))
    assert not missing, f"modules the wheel lacks: {missing[:10]}"


def test_the_wheel_installs_one_top_level_name(wheel):
    """One import name per distribution: `pip install ckptspec` puts `ckptspec` (and its metadata) into
    site-packages and nothing that could shadow a user's own `benchmarks` or `impl`."""
    tops = {name.split("/")[0] for name in _names(wheel)}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"ckptspec"}, sorted(tops)


def test_the_wheel_holds_the_data_the_suite_reads(wheel):
    data = _tracked("ckptspec/spec/*.toml", "ckptspec/bench/baseline/*.json")
    stored = [f"ckptspec/report/data/stored/{Path(name).name}" for name in _tracked("conformance/all/*.json")]
    assert len(stored) >= 10, "git ls-files found too few stored runs to check"
    wanted = {*data, *stored, "ckptspec/spec/harness/installed.toml", "ckptspec/report/data/advice.toml"}
    assert any(name.endswith(".expectations.toml") for name in wanted), "no expectations file found to check"
    missing = sorted(wanted - _names(wheel))
    assert not missing, f"data files the wheel lacks: {missing}"
    with zipfile.ZipFile(wheel) as archive:
        rules = archive.read("ckptspec/report/data/advice.toml")
    assert rules == (REPO_ROOT / "findings" / "advice.toml").read_bytes(), "the packaged usage rules differ"


def test_the_wheel_metadata_has_the_version_the_urls_and_the_command(wheel):
    with zipfile.ZipFile(wheel) as archive:
        info = next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
        meta = email.message_from_bytes(archive.read(info))
        entry_points = archive.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert meta["Version"] == PYPROJECT["project"]["version"]
    urls = meta.get_all("Project-URL") or []
    assert {u.split(",")[0] for u in urls} >= {"Homepage", "Repository", "Changelog"}, urls
    assert "ckptspec = ckptspec.cli:main" in entry_points


def test_an_installed_copy_runs_from_site_packages(wheel, tmp_path):
    target, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    elsewhere.mkdir()
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-compile", "-q", "--target", str(target)]
    subprocess.run([*pip, str(wheel)], check=True, timeout=300, capture_output=True)
    env = clean_env(PYTHONPATH=str(target))
    probe = (
        "from ckptspec.report import clauses, installed; from ckptspec.report import advice; "
        "print(installed.CHECKOUT, installed.ROOT, len(advice.load(clauses.load())) > 0)"
    )
    done = _python(["-c", probe], elsewhere, env)
    assert done.stdout.split() == ["False", str(target), "True"], done.stdout + done.stderr
    for theirs in ("benchmarks", "impl"):  # a library's own packages of those names shadow nothing
        (elsewhere / theirs).mkdir()
        (elsewhere / theirs / "__init__.py").write_text(
            f"raise ImportError('the user\\'s own {theirs} was imported')\n"
        )
    done = _python(["-m", "ckptspec", "--version"], elsewhere, env)
    assert done.stdout.startswith("ckptspec "), done.stdout + done.stderr
    done = _python(["-m", "ckptspec.bench.regression", "--help"], elsewhere, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    collect = ["-m", "ckptspec.cli", "pytest", "--pyargs", "ckptspec.spec.protocol.test_snapshot"]
    done = _python([*collect, "--collect-only", "-q", "--impl", "impl", "-p", "no:randomly"], elsewhere, env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    ids = [line for line in done.stdout.splitlines() if "::" in line]
    assert ids, done.stdout[-3000:]
    assert all(i.startswith("ckptspec/spec/protocol/test_snapshot.py::") for i in ids), ids[:3]


def test_the_wheel_alone_reports_the_stored_verdicts_without_torch(wheel, tmp_path):
    """`pip install ckptspec` (no extra) into a fresh virtual environment: no torch comes with it, and `ckptspec
    report` prints the stored verdicts from the runs the wheel carries; `ckptspec judge` says what to install."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    python = str(venv / "bin" / "python")
    pip = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(wheel)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    env = clean_env()
    probe = "import importlib.util as u; print([m for m in ('torch', 'pytest', 'numpy') if u.find_spec(m)])"
    done = _python_in(python, ["-c", probe], tmp_path, env)
    assert done.stdout.strip() == "[]", done.stdout + done.stderr
    done = _python_in(python, ["-m", "ckptspec", "report", "--areas", "protocol"], tmp_path, env)
    assert done.returncode == 0, done.stderr[-3000:]
    header = done.stdout.splitlines()[0]
    assert "nvrx 0.7.0" in header, header
    assert "| P-SNAP-1 |" in done.stdout
    done = _python_in(python, ["-m", "ckptspec", "judge", "nvrx"], tmp_path, env)
    assert done.returncode != 0
    assert "ckptspec[test]" in done.stderr, done.stderr


def _python_in(python: str, args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([python, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def _python(args: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240)


def test_the_installed_configuration_says_what_pyproject_says():
    packaged = tomllib.loads(installed.INSTALLED_CONFIG.read_text())
    assert packaged["tool"]["ckptspec"] == PYPROJECT["tool"]["ckptspec"]
    ours = dict(PYPROJECT["tool"]["pytest"]["ini_options"])
    theirs = dict(packaged["tool"]["pytest"]["ini_options"])
    assert theirs.pop("addopts") == [*ours.pop("addopts"), "-p", "ckptspec.bench.options"]
    assert theirs == {k: v for k, v in ours.items() if k not in CHECKOUT_ONLY}


def test_a_checkout_is_run_with_its_own_configuration():
    assert installed.CHECKOUT
    assert installed.CONFIG == REPO_ROOT / "pyproject.toml"
    assert installed.pytest_options() == []
    assert installed.pytest_options(anywhere=True) == ["-c", str(installed.CONFIG), "--rootdir", str(REPO_ROOT)]
    assert installed.data_file("findings/advice.toml") == REPO_ROOT / "findings" / "advice.toml"


def test_the_version_comes_from_the_installed_metadata(capsys):
    from importlib import metadata

    from ckptspec.cli import main

    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"ckptspec {metadata.version('ckptspec')}\n"
    assert version() == metadata.version("ckptspec")


def test_the_docs_name_the_repository_of_the_urls():
    repository = PYPROJECT["project"]["urls"]["Repository"].removeprefix("https://github.com/")
    named = [p for p in (REPO_ROOT / "docs" / "examples").glob("*.yml") if "ckptspec" in p.read_text()]
    assert named, "no example names the ckptspec repository"
    for path in named:
        assert f"{repository}/" in path.read_text() or f"repository: {repository}" in path.read_text(), path
    assert os.path.basename(repository) == "ckptspec"
