"""The wheelhouse: filled here with network access (`prepare`), installed from offline on the GPU machine (`install`).

Layout: one folder per group under the wheelhouse, `base` (the project's dependencies and test extra but moto and
boto3), `s3` (moto[s3], flask, flask-cors, boto3) and one per release (`nvrx-0.4.1`, ...: the release's wheel and its `needs`),
each with a `group.json` that names its requirements and the Python it was downloaded for. A group holds the
whole closure of its requirements for that Python and Linux x86-64, less plan.MACHINE_PROVIDES (torch and what
comes with it) and less what `base` already holds, so that each fits the 64 MiB a device call carries.

`install` puts nothing into the machine's Python: it asks pip which of a group's requirements that Python lacks
(a dry run against its own site-packages plus what was installed before), installs exactly those wheels with
--no-deps into a folder of the work directory, and the stages put that folder first on PYTHONPATH. A release's
wheel goes alone into a folder of its own (--no-deps, for the wheel's own platform tags), so releases of one
target never meet.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import urlparse
from urllib.request import url2pathname

from gpu_run import plan

PLATFORMS = (
    *(f"manylinux_2_{n}_x86_64" for n in (39, 35, 34, 31, 28, 27, 24, 17)),
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
    "linux_x86_64",
)


NOT_INSTALLABLE = "not installable here"


class SetupError(RuntimeError):
    """A set-up step failed; the message says which and why in one line or a few."""


def _pip(python: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    command = [python, "-m", "pip", "--disable-pip-version-check", *args]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
        raise SetupError(f"pip {args[0]} failed ({' '.join(command[3:])[:300]}):\n{tail}")
    return done


def _download_args(python_version: str) -> list[str]:
    platforms = [arg for platform in PLATFORMS for arg in ("--platform", platform)]
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp", *platforms]


def _wheel_name(path: Path) -> str:
    return plan.distribution_name(path.name.split("-", 1)[0])


def groups_to_prepare() -> dict[str, list[str]]:
    """Group -> the requirements it is downloaded for (a release's own wheel is fetched apart, without deps)."""
    groups = plan.project_requirements()
    for name, release in plan.RELEASES.items():
        groups[name] = list(release.needs)
    return groups


def prepare(wheelhouse: Path, python_version: str, only: list[str] | None = None) -> dict[str, str]:
    """Download every group (or those in `only`) into `wheelhouse`; group -> "N files, X MiB" or why it is absent.

    A release with no wheel for `python_version` is left out with the reason (its stages then say so).
    """
    wheelhouse.mkdir(parents=True, exist_ok=True)
    base_names = {_wheel_name(p) for p in (wheelhouse / "base").glob("*.whl")}
    report = {}
    for group, requirements in groups_to_prepare().items():
        if only and group not in only:
            continue
        folder = wheelhouse / group
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "download", "-q", "-d", str(folder)]
        release = plan.RELEASES.get(group)
        if release:
            got = subprocess.run([*pip, "--no-deps", *_download_args(python_version), release.requirement])
            if got.returncode != 0:
                shutil.rmtree(folder)
                report[group] = f"absent: no wheel of {release.requirement} for Python {python_version}"
                continue
        if requirements:
            subprocess.run([*pip, *_download_args(python_version), *requirements], check=True)
        for wheel in folder.glob("*.whl"):
            name = _wheel_name(wheel)
            if name in plan.MACHINE_PROVIDES or (group != "base" and name in base_names):
                wheel.unlink()
        if group == "base":
            base_names = {_wheel_name(p) for p in folder.glob("*.whl")}
        meta = {
            "python": python_version,
            "requirements": requirements,
            "release": release.requirement if release else None,
        }
        (folder / "group.json").write_text(json.dumps(meta, indent=1))
        files = list(folder.glob("*.whl"))
        report[group] = f"{len(files)} wheels, {sum(f.stat().st_size for f in files) / 2**20:.1f} MiB"
    return report


def folder_mib(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 2**20


# ------------------------------------------------------------------------------------- on the machine


def _missing(python: str, requirements: list[str], links: list[Path], env: dict) -> list[Path]:
    """The wheel files pip would install for `requirements` into `python`'s environment (as `env` shows it)."""
    if not requirements:
        return []
    with tempfile.TemporaryDirectory(prefix="ckptspec-pip-") as tmp:
        report_path = Path(tmp) / "report.json"
        find = [arg for link in links for arg in ("--find-links", str(link))]
        _pip(
            python,
            "install",
            "--dry-run",
            "-q",
            "--no-index",
            "--only-binary=:all:",
            *find,
            "--report",
            str(report_path),
            *requirements,
            env=env,
        )
        report = json.loads(report_path.read_text())
    return [Path(url2pathname(urlparse(item["download_info"]["url"]).path)) for item in report.get("install", [])]


def _install_into(python: str, wheels: list[Path], site: Path, env: dict, platform_tags: bool = False) -> None:
    if not wheels:
        return
    site.mkdir(parents=True, exist_ok=True)
    forced: list[str] = []
    if platform_tags:  # a release's wheel may carry a newer manylinux tag than this glibc admits (NVRx 0.7.0)
        major, minor = _python_version(python)
        tags = wheels[0].name.removesuffix(".whl").split("-")[-1].split(".")
        forced = ["--only-binary=:all:", "--python-version", f"{major}.{minor}", "--implementation", "cp"]
        forced += [arg for tag in tags for arg in ("--platform", tag)]
    _pip(python, "install", "-q", "--no-deps", "--no-index", "--upgrade", "--target", str(site), *forced,
         *map(str, wheels), env=env)  # fmt: skip


def _python_version(python: str) -> tuple[int, int]:
    out = subprocess.run([python, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True)
    major, minor = out.stdout.split()
    return int(major), int(minor)


def pythonpath(work: Path, releases: tuple[str, ...] | list[str]) -> str:
    """PYTHONPATH of a stage: its releases' folders, then the installed groups, then this checkout."""
    parts = [work / f"site-{release}" for release in releases] + [work / "site", plan.ROOT]
    return os.pathsep.join(str(p) for p in parts)


def install(python: str, wheelhouse: Path, work: Path, groups: list[str], log) -> dict[str, str]:
    """Install the groups (base and s3 into work/site, each release into work/site-<release>) from `wheelhouse`.

    Group -> what was done ("3 installed", "nothing missing", "absent from the wheelhouse", NOT_INSTALLABLE and
    pip's reason). A group absent from the wheelhouse, or a release whose wheel this Python cannot install (NVRx
    0.7.0's cp312 wheel on a 3.11 dry run), is no error here: the stages that need it are marked so. Raises
    SetupError when pip fails otherwise.
    """
    present = [g for g in groups if (wheelhouse / g / "group.json").is_file()]
    links = [wheelhouse / g for g in present]
    done: dict[str, str] = {}
    for group in groups:
        if group not in present:
            done[group] = "absent from the wheelhouse"
            continue
        meta = json.loads((wheelhouse / group / "group.json").read_text())
        release = plan.RELEASES.get(group)
        site = work / (f"site-{group}" if release else "site")
        env = {**os.environ, "PYTHONPATH": pythonpath(work, [group] if release else [])}
        installed = 0
        if release:
            pattern = f"{release.distribution.replace('-', '_')}-{release.version}-*.whl"
            wheel = next((wheelhouse / group).glob(pattern), None)
            if wheel is None:
                raise SetupError(f"{wheelhouse / group} holds no {pattern}: run `python -m gpu_run prepare` again")
            if not (site / f"{wheel.name.split('-')[0]}-{release.version}.dist-info").is_dir():
                try:
                    _install_into(python, [wheel], site, env, platform_tags=True)
                except SetupError as exc:  # another Python than the wheel's: only this release's stages stop
                    done[group] = f"{NOT_INSTALLABLE}: {str(exc).splitlines()[-1][:200]}"
                    log(f"set-up: {group}: {done[group]}")
                    continue
                installed += 1
        wheels = _missing(python, meta["requirements"], links, env)
        _install_into(python, wheels, site, env)
        installed += len(wheels)
        done[group] = f"{installed} installed" if installed else "nothing missing"
        log(
            f"set-up: {group}: {done[group]}"
            + (f" ({', '.join(w.name.split('-')[0] for w in wheels)})" if wheels else "")
        )
    return done
