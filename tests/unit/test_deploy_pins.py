"""What the images are built from is pinned: base images by digest (or, where no digest could be
had, the placeholder and the command that resolves it), the Debian packages at versions bookworm
serves, and every Python package the images install by deploy/constraints.txt, within
pyproject.toml's ranges."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from tests.unit.test_deploy_manifests import DEPLOY, DOCKERFILES, ROOT, dockerfile_instructions

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, as its PyPI package
    tomllib = pytest.importorskip("tomli", reason="Python 3.10 without tomli: cannot read TOML")

CONSTRAINTS = DEPLOY / "constraints.txt"
DIGEST = re.compile(r"^[a-z0-9./_-]+:[A-Za-z0-9._-]+@sha256:[0-9a-f]{64}$")
# Base images no digest could be found for (no registry is reachable from the project's machines,
# and none was found stated by their publisher): tag only, with a placeholder line to fill.
UNRESOLVED = {"nvidia/cuda:12.6.3-cudnn-runtime-ubuntu24.04"}


def _args(path: Path) -> dict[str, str]:
    return dict(a.split("=", 1) for a in dockerfile_instructions(path).get("ARG", []) if "=" in a)


def base_images(path: Path) -> list[str]:
    """The images the Dockerfile's stages start from (ARG defaults resolved; stages named by
    other stages left out)."""
    args = _args(path)
    froms = [f.split()[0] for f in dockerfile_instructions(path)["FROM"]]
    stages = {f.split()[-1] for f in dockerfile_instructions(path)["FROM"] if " AS " in f}
    resolved = [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], f) for f in froms]
    return [image for image in resolved if image not in stages]


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_base_images_are_pinned_by_digest(path: Path) -> None:
    text = path.read_text()
    for image in base_images(path):
        if image in UNRESOLVED:
            # The placeholder to fill and the command that gives its digest.
            assert f"{image}@sha256:<digest: not yet resolved>" in text
            assert f"docker buildx imagetools inspect {image}" in text
        else:
            assert DIGEST.match(image), image


def test_the_images_share_one_python_base() -> None:
    pythons = {i for p in DOCKERFILES for i in base_images(p) if i.startswith("python:")}
    assert len(pythons) == 1, pythons


def apt_installs(path: Path) -> list[str]:
    """The packages the Dockerfile's `apt-get install` commands name."""
    packages: list[str] = []
    for run in dockerfile_instructions(path).get("RUN", []):
        for command in re.findall(r"apt-get install ([^&;]*)", run):
            packages += [w for w in command.split() if not w.startswith("-")]
    return packages


def test_debian_packages_are_pinned() -> None:
    packages = apt_installs(DEPLOY / "Dockerfile")
    assert "libgrpc++1.51=1.51.1-3+b1" in packages
    unpinned = [p for p in packages if "=" not in p]
    assert unpinned == []


def _debian_codename() -> str:
    os_release = Path("/etc/os-release")
    if not os_release.exists():
        return ""
    match = re.search(r"^VERSION_CODENAME=(\S+)$", os_release.read_text(), re.M)
    return match.group(1) if match else ""


def archive_versions(name: str) -> dict[str, list[str]]:
    """Each version of ``name`` that apt's package lists know -> the archives serving it (from
    `apt-cache policy`; the installed-only entry, /var/lib/dpkg/status, is no archive)."""
    policy = subprocess.run(
        ["apt-cache", "policy", name], capture_output=True, text=True, timeout=60, check=False
    ).stdout
    versions: dict[str, list[str]] = {}
    current = ""
    for line in policy.partition("Version table:")[2].splitlines():
        entry = re.match(r"^ (?:\*\*\*|   ) (\S+) -?\d+$", line)  # " *** VERSION PRIORITY"
        if entry:
            current = entry.group(1)
            versions[current] = []
        elif current and "://" in line:  # "        PRIORITY URL SUITE/COMPONENT ARCH Packages"
            versions[current].append(line.strip())
    return versions


def test_bookworm_serves_the_pinned_versions() -> None:
    if _debian_codename() != "bookworm" or shutil.which("apt-cache") is None:
        pytest.skip("not a Debian 12 (bookworm) machine: cannot ask apt what bookworm serves")
    pins = [pin.partition("=") for pin in apt_installs(DEPLOY / "Dockerfile")]
    known = {name: archive_versions(name) for name, _, _ in pins}
    if not any(sources for versions in known.values() for sources in versions.values()):
        pytest.skip("apt's package lists are empty here (run apt-get update): cannot check")
    for name, _, version in pins:
        assert version, f"{name} is not pinned"
        sources = known[name].get(version, [])
        assert any(" bookworm" in s for s in sources), (
            f"bookworm does not serve {name}={version}; apt knows {known[name]}"
        )


def constraints() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, sep, version = line.partition("==")
            assert sep and version, f"not NAME==VERSION: {line}"
            assert canonicalize_name(name) not in pins, f"pinned twice: {name}"
            pins[canonicalize_name(name)] = Version(version)
    return pins


def test_constraints_pin_every_dependency_and_build_requirement() -> None:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wanted = pyproject["project"]["dependencies"] + pyproject["build-system"]["requires"]
    pins = constraints()
    for requirement in map(Requirement, wanted):
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement} is not pinned in {CONSTRAINTS.name}"
        assert requirement.specifier.contains(pins[name], prereleases=True), (
            f"{name}=={pins[name]} is outside pyproject.toml's {requirement}"
        )


@pytest.mark.parametrize("path", DOCKERFILES, ids=lambda p: p.name)
def test_dockerfiles_install_with_the_constraints(path: Path) -> None:
    runs = dockerfile_instructions(path)["RUN"]
    installs = [r for r in runs if re.search(r"install\.sh (wheel|install)\b", r)]
    assert len(installs) == 2  # the wheel's build and its install
    for run in installs:
        assert re.search(r"\bPIP_CONSTRAINT=/(src/deploy/)?constraints\.txt\b", run), run
    assert any("source=deploy/constraints.txt,target=/constraints.txt" in r for r in runs)
