"""The Containerfile (no container engine here to build it) agrees with scripts/build-image and
the chart: the same base, user, entry point, venv and labels, and a final stage without
build tools."""

from __future__ import annotations

import re

from tests.support.k8s import REPO_ROOT

CONTAINERFILE = (REPO_ROOT / "Containerfile").read_text()
BUILD_IMAGE = (REPO_ROOT / "scripts/build-image").read_text()


def _stages() -> list[str]:
    """The Containerfile's stages, each from its FROM line on."""
    return re.split(r"^(?=FROM )", CONTAINERFILE, flags=re.MULTILINE)[1:]


def _shell_value(name: str) -> str:
    match = re.search(rf'^{name}="([^"]*)"', BUILD_IMAGE, flags=re.MULTILINE)
    assert match, name
    return match.group(1)


def test_two_stages_and_the_final_one_installs_no_build_tools() -> None:
    build, final = _stages()
    assert build.startswith("FROM ${DEBIAN} AS build")
    assert "COPY --from=build /opt/gpuportal /opt/gpuportal" in final
    for tool in ("gcc", "build-essential", "python3-pip", "python3-venv", "pip install"):
        assert tool not in final, tool
    # The build stage removes pip from the venv it hands over.
    assert "pip uninstall --yes pip" in build


def test_same_base_packages_user_and_entry_point_as_build_image() -> None:
    suite = _shell_value("SUITE")
    assert f"ARG DEBIAN=debian:{suite}-slim" in CONTAINERFILE
    uid = _shell_value("UID_GID")
    _, final = _stages()
    assert f"USER {uid}:{uid}" in final
    assert f"--uid {uid} --gid {uid}" in final
    venv = _shell_value("VENV_DIR")
    assert f'ENTRYPOINT ["{venv}/bin/gpuportal"]' in final
    # Every Debian package scripts/build-image adds to the Essential set is installed here too.
    install = re.search(r"apt-get install[^&]*", final)
    assert install
    for package in _shell_value("DEBIAN_PACKAGES").split(","):
        assert re.search(rf"\b{re.escape(package)}\b", install.group(0)), package


def test_the_same_oci_labels_as_build_image() -> None:
    wanted = set(re.findall(r'"(org\.opencontainers\.image\.[a-z.]+)=', BUILD_IMAGE))
    assert {"org.opencontainers.image.version", "org.opencontainers.image.revision"} <= wanted
    given = set(re.findall(r"(org\.opencontainers\.image\.[a-z.]+)=", CONTAINERFILE))
    assert wanted == given


def test_the_charts_pods_run_as_the_images_user() -> None:
    uid = _shell_value("UID_GID")
    helpers = (REPO_ROOT / "helm/gpuportal/templates/_helpers.tpl").read_text()
    assert f"runAsUser: {{{{ .runAsUser | default {uid} }}}}" in helpers
