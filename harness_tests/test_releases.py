"""The release list (ckptspec/report/releases.py) and what is written from it elsewhere: pyproject.toml's extras
never downgrade an installed library, the stored runs are the listed releases', and the list imports without torch."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from ckptspec.report import clauses, releases
from ckptspec.spec.harness.surface.loading import builtin_targets

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
# Specifier operators that can make pip replace an installed newer release with an older one.
DOWNGRADING = ("==", "===", "<", "<=", "~=", "!=")


def _extras_by_distribution() -> dict[str, list[Requirement]]:
    found: dict[str, list[Requirement]] = {}
    for requirements in PROJECT["optional-dependencies"].values():
        for text in requirements:
            requirement = Requirement(text)
            found.setdefault(requirement.name, []).append(requirement)
    return found


def test_every_listed_library_has_an_extra_whose_lower_bound_is_its_lowest_listed_release():
    extras = _extras_by_distribution()
    requires_python = PROJECT["requires-python"].removeprefix(">=")
    for distribution in {r.distribution for r in releases.RELEASES} - {"torch"}:
        listed = [r for r in releases.RELEASES if r.distribution == distribution]
        lowest = min(listed, key=lambda r: Version(r.version))
        assert distribution in extras, f"no extra of pyproject.toml installs {distribution}"
        for requirement in extras[distribution]:
            bounds = {spec.operator: spec.version for spec in requirement.specifier}
            assert bounds == {">=": lowest.version}, f"{requirement}: want >={lowest.version} and nothing else"
            if Version(lowest.python) > Version(requires_python):
                marker = str(requirement.marker or "")
                assert f'python_version >= "{lowest.python}"' in marker, f"{requirement}: needs Python {lowest.python}"


def test_no_extra_or_dependency_pins_a_library_version_that_could_downgrade_it():
    """Exact pins are allowed only for the project's own tools (lint, the schema checker), never a library under
    test or torch: a user installs this project beside the stack they want judged."""
    judged = {r.distribution for r in releases.RELEASES}
    every = [Requirement(t) for t in PROJECT["dependencies"]]
    every += [r for group in _extras_by_distribution().values() for r in group]
    for requirement in every:
        if requirement.name in judged:
            operators = {spec.operator for spec in requirement.specifier}
            assert not operators & set(DOWNGRADING), f"{requirement} could downgrade an installed {requirement.name}"


def test_the_listed_releases_name_known_targets_areas_and_stored_runs():
    known = builtin_targets()
    names = [r.name for r in releases.RELEASES]
    assert len(names) == len(set(names)), names
    assert set(releases.ALL_AREAS) == set(clauses.AREAS)
    stored = {p.stem for p in (ROOT / "conformance" / "all").glob("*.json")}
    for release in releases.RELEASES:
        assert release.target in known, release
        assert set(release.areas) <= set(releases.ALL_AREAS), release
        assert release.name in stored, f"{release.stored_run} is missing: nox -s 'record({release.name})'"
    references = {releases.REFERENCE, releases.LOCAL_REFERENCE}
    assert stored - set(names) == references, "every stored run but impl's two is a listed release's"


def test_find_matches_an_installed_version_by_its_release():
    assert releases.find("dcp-thread", f"{releases.TORCH}+cpu") is not None
    assert releases.find("nvrx", "0.4.1") == releases.by_name()["nvrx-0.4.1"]
    assert releases.find("nvrx", "0.5.0") is None


def test_the_release_list_and_the_run_readers_import_without_torch():
    """gpu_run imports the list before anything is installed; `ckptspec report` reads stored runs without torch."""
    code = (
        "import sys; sys.modules['torch'] = None; sys.modules['psutil'] = None\n"
        "import ckptspec.report.releases, ckptspec.report.report, ckptspec.report.findings\n"
        "import ckptspec.report.provenance, ckptspec.cli\n"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr


def test_each_library_with_a_benchmark_peer_names_one_release_whose_cpu_run_is_stored():
    """The benchmarks' peers, gpu_run's benchmark stages and regenerate.py's benchmark table all read
    releases.benchmark_peers(): one release per library, the newest listed, with its stored CPU benchmark run."""
    peers = releases.benchmark_peers()
    assert sorted(r.target for r in peers) == ["mcore", "nvrx"]
    for peer in peers:
        newest = max((r for r in releases.RELEASES if r.target == peer.target), key=lambda r: Version(r.version))
        assert peer == newest, f"{peer.name}: the benchmark peer should be {newest.name}, the newest listed"
        assert (ROOT / "ckptspec" / "bench" / "results" / f"cpu-{peer.name}.json").is_file(), peer.name


def test_newest_names_each_judged_target_once_at_its_highest_listed_version():
    """`ci_job summary --stored` shows a run beside releases.newest(areas): one release per target judged on those
    areas, its highest version by number (2.15.0 after 2.13.0; 0.10 would come after 0.9), each with a stored run."""
    for areas in (releases.PROTOCOL_AREAS, ("async_ckpt",), ("manager",)):
        chosen = releases.newest(areas)
        judged = {r.target for r in releases.RELEASES if set(r.areas) & set(areas)}
        assert sorted(r.target for r in chosen) == sorted(judged), areas
        for release in chosen:
            same = [r for r in releases.RELEASES if r.target == release.target]
            assert release == max(same, key=lambda r: Version(r.version)), release.name
            assert (ROOT / release.stored_run).is_file(), release.stored_run
