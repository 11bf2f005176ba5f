"""The container image scripts/build-image makes: built (or reused from GPUPORTAL_IMAGE_DIR, a
build made earlier in the same run), unpacked with umoci, and its entry points run inside that
root with chroot as the image's own non-root user, so nothing of the host's Python is used."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tarfile
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.k8s import REPO_ROOT

# Building takes minutes on a loaded machine; the module's first test pays for it.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

VERSION = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["version"]
LABELS = ("version", "source", "licenses", "revision", "created", "title")


@dataclass(frozen=True, slots=True)
class Image:
    out: Path  # scripts/build-image's --out
    root: Path  # the unpacked root filesystem
    config: dict[str, Any]  # the OCI image config
    manifest: dict[str, Any]

    @property
    def user(self) -> str:
        return str(self.config["config"]["User"])

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Runs argv in the root as the image's user, with the image's environment only, in
        mount and PID namespaces of its own with a /proc, as a container runtime would."""
        env = list(self.config["config"]["Env"])
        namespaces = ["unshare", "--mount", "--pid", "--fork", f"--mount-proc={self.root}/proc"]
        chroot = ["chroot", f"--userspec={self.user}", str(self.root), "/usr/bin/env", "-i"]
        result = subprocess.run(
            [*namespaces, *chroot, *env, *argv],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if check:
            assert result.returncode == 0, (argv, result.stdout, result.stderr)
        return result


def _blob(layout: Path, digest: str) -> dict[str, Any]:
    algorithm, _, value = digest.partition(":")
    loaded: dict[str, Any] = json.loads((layout / "blobs" / algorithm / value).read_text())
    return loaded


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Image]:
    if os.geteuid() != 0:
        pytest.skip("building and chrooting into the image needs root (as in CI)")
    reused = os.environ.get("GPUPORTAL_IMAGE_DIR")
    if reused:
        out = Path(reused)
    else:
        out = tmp_path_factory.mktemp("image")
        build = subprocess.run(
            [str(REPO_ROOT / "scripts/build-image"), "--out", str(out)],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        )
        assert build.returncode == 0, build.stderr[-4000:]
    layout = out / "oci"
    index = json.loads((layout / "index.json").read_text())
    (entry,) = [
        m
        for m in index["manifests"]
        if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == VERSION
    ]
    manifest = _blob(layout, entry["digest"])
    config = _blob(layout, manifest["config"]["digest"])
    root = tmp_path_factory.mktemp("image-root") / "rootfs"
    subprocess.run(
        ["umoci", "raw", "unpack", "--image", f"{layout}:{VERSION}", str(root)],
        check=True,
        capture_output=True,
    )
    yield Image(out, root, config, manifest)
    # About a gigabyte unpacked and half that built: not left behind in pytest's temp folders.
    shutil.rmtree(root)
    if not reused:
        shutil.rmtree(out)


def test_labels_user_and_entry_point_are_in_the_config(image: Image) -> None:
    labels = image.config["config"]["Labels"]
    for name in LABELS:
        assert labels.get(f"org.opencontainers.image.{name}"), name
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.licenses"] == "Apache-2.0"
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?", labels["org.opencontainers.image.revision"])
    assert image.manifest["annotations"]["org.opencontainers.image.version"] == VERSION
    assert image.config["config"]["Entrypoint"] == ["/opt/gpuportal/bin/gpuportal"]


def test_the_user_is_numeric_non_root_and_the_charts_default(image: Image) -> None:
    uid, _, gid = image.user.partition(":")
    assert uid.isdigit() and gid.isdigit() and int(uid) != 0, image.user
    # The chart's pods run as this uid unless told otherwise (runAsNonRoot needs a number).
    helpers = (REPO_ROOT / "helm/gpuportal/templates/_helpers.tpl").read_text()
    assert f"runAsUser: {{{{ .runAsUser | default {uid} }}}}" in helpers
    assert image.run("id", "-u").stdout.strip() == uid
    passwd = (image.root / "etc/passwd").read_text()
    assert f":{uid}:{gid}:" in passwd
    # Its home is the state directory, which it owns.
    assert (image.root / "var/lib/gpuportal").stat().st_uid == int(uid)


def test_version_and_serve_help_run_on_the_images_own_python(image: Image) -> None:
    assert image.run("gpuportal", "--version").stdout == f"gpuportal {VERSION}\n"
    assert "usage: gpuportal serve" in image.run("gpuportal", "serve", "--help").stdout
    where = image.run("python", "-c", "import sys, portal; print(sys.prefix, portal.__file__)")
    prefix, module = where.stdout.split()
    assert prefix == "/opt/gpuportal"
    assert module.startswith("/opt/gpuportal/lib/python3.13/site-packages/portal/"), module


def test_the_agent_without_a_gpu_says_so_and_fails_without_a_traceback(image: Image) -> None:
    # No NVML library in the image (the NVIDIA runtime injects it on GPU nodes): a clear error
    # and the usage exit code, not a crash and not an empty success.
    result = image.run("gpuportal", "agent", "--once", "--stdout", check=False)
    assert result.returncode == 2, (result.stdout, result.stderr)
    assert "no NVIDIA driver found" in result.stderr
    assert "--demo" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stdout == ""
    # The same command with simulated GPUs samples them.
    demo = image.run("gpuportal", "agent", "--demo", "--once", "--stdout")
    batches = [json.loads(line) for line in demo.stdout.splitlines()]
    assert batches and all(b["samples"] for b in batches)


def test_the_dashboards_and_the_postgresql_driver_import(image: Image) -> None:
    # Panel pulls in numpy and pandas, whose wheels need the C++ runtime from Debian.
    image.run("python", "-c", "import dashboards.app")
    libpq = image.run("python", "-c", "import psycopg; print(psycopg.pq.__impl__)")
    assert libpq.stdout.strip() == "binary"
    assert image.run("pg_dump", "--version").stdout.startswith("pg_dump (PostgreSQL)")


def test_no_compiler_pip_or_apt_in_the_root(image: Image) -> None:
    root = image.root
    for pattern in (
        "usr/bin/gcc*",
        "usr/bin/cc",
        "usr/bin/apt*",
        "usr/bin/pip*",
        "opt/gpuportal/bin/pip*",
    ):
        assert not list(root.glob(pattern)), pattern
    assert not list(root.glob("opt/gpuportal/lib/python3*/site-packages/pip"))
    assert image.run("python", "-m", "pip", "--version", check=False).returncode != 0
    assert image.run("python", "-m", "ensurepip", "--version", check=False).returncode != 0


def test_the_sbom_lists_debian_packages_and_python_distributions(image: Image) -> None:
    inside = image.config["config"]["Labels"]["io.gpuportal.sbom"]
    beside = image.out / f"gpuportal-{VERSION}.spdx.json"
    assert (image.root / inside.lstrip("/")).read_bytes() == beside.read_bytes()
    sbom = json.loads(beside.read_text())
    assert sbom["spdxVersion"] == "SPDX-2.3"
    purls = {
        ref["referenceLocator"].split("@")[0]: ref["referenceLocator"]
        for package in sbom["packages"]
        for ref in package.get("externalRefs", [])
    }
    assert "pkg:deb/debian/python3" in purls
    installed = image.run("python", "-c", "import sqlalchemy; print(sqlalchemy.__version__)")
    assert purls["pkg:pypi/sqlalchemy"] == f"pkg:pypi/sqlalchemy@{installed.stdout.strip()}"
    assert purls["pkg:pypi/gpuportal"] == f"pkg:pypi/gpuportal@{VERSION}"
    # Every package is contained in the image the document describes.
    contained = {
        r["relatedSpdxElement"]
        for r in sbom["relationships"]
        if r["relationshipType"] == "CONTAINS" and r["spdxElementId"] == "SPDXRef-image"
    }
    assert {p["SPDXID"] for p in sbom["packages"]} - contained == {"SPDXRef-image"}


def test_the_tarball_is_the_oci_layout(image: Image) -> None:
    with tarfile.open(image.out / f"gpuportal-{VERSION}.oci.tar") as archive:
        names = set(archive.getnames())
    assert {"./oci-layout", "./index.json"} <= names
    blobs = {f"./blobs/sha256/{p.name}" for p in (image.out / "oci/blobs/sha256").iterdir()}
    assert blobs <= names
