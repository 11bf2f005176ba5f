"""Writes an SPDX 2.3 JSON SBOM of an image root: its Debian packages (from dpkg's status file)
and the Python distributions of its venv (from their .dist-info metadata).

Usage: python scripts/image_sbom.py ROOT --name NAME --venv /opt/gpuportal --created ISO --out FILE

Standard library only, so it runs with any Python >= 3.11; scripts/build-image calls it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from email.parser import HeaderParser
from pathlib import Path
from typing import Any

DPKG_STATUS = "var/lib/dpkg/status"
# SPDX identifiers allow letters, digits, "." and "-" only.
_NOT_IN_ID = re.compile(r"[^A-Za-z0-9.-]+")


def debian_packages(root: Path) -> list[dict[str, str]]:
    """The installed packages in dpkg's status file: name, version, architecture, source."""
    packages = []
    for stanza in (root / DPKG_STATUS).read_text(encoding="utf-8").split("\n\n"):
        fields: dict[str, str] = {}
        for line in stanza.splitlines():
            if line[:1] in (" ", "\t") or ":" not in line:
                continue
            key, _, value = line.partition(":")
            fields[key] = value.strip()
        if fields.get("Status", "").endswith(" installed") and "Package" in fields:
            packages.append(fields)
    return packages


def python_distributions(root: Path, venv: str) -> list[dict[str, str]]:
    """Name, version and licence of every distribution installed in the venv."""
    dists = []
    for metadata in sorted(
        root.glob(f"{venv.strip('/')}/lib/python3*/site-packages/*.dist-info/METADATA")
    ):
        headers = HeaderParser().parsestr(metadata.read_text(encoding="utf-8", errors="replace"))
        dists.append(
            {
                "name": headers.get("Name", ""),
                "version": headers.get("Version", ""),
                "license": headers.get("License-Expression", "") or "",
            }
        )
    return dists


def _deb_package(fields: dict[str, str], distro: str) -> dict[str, Any]:
    name, version, arch = (
        fields["Package"],
        fields.get("Version", ""),
        fields.get("Architecture", ""),
    )
    return {
        "SPDXID": f"SPDXRef-deb-{_NOT_IN_ID.sub('-', name)}-{_NOT_IN_ID.sub('-', arch)}",
        "name": name,
        "versionInfo": version,
        "supplier": "Organization: Debian",
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False,
        "licenseConcluded": "NOASSERTION",
        "licenseDeclared": "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "externalRefs": [
            {
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": f"pkg:deb/debian/{name}@{version}?arch={arch}&distro={distro}",
            }
        ],
    }


def _python_package(dist: dict[str, str]) -> dict[str, Any]:
    normalized = re.sub(r"[-_.]+", "-", dist["name"]).lower()
    return {
        "SPDXID": f"SPDXRef-pypi-{_NOT_IN_ID.sub('-', normalized)}",
        "name": dist["name"],
        "versionInfo": dist["version"],
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False,
        "licenseConcluded": "NOASSERTION",
        # Only an SPDX expression from the metadata is declared; free-text licences are not.
        "licenseDeclared": dist["license"] or "NOASSERTION",
        "copyrightText": "NOASSERTION",
        "externalRefs": [
            {
                "referenceCategory": "PACKAGE-MANAGER",
                "referenceType": "purl",
                "referenceLocator": f"pkg:pypi/{normalized}@{dist['version']}",
            }
        ],
    }


def _distro(root: Path) -> str:
    release = {}
    for line in (root / "etc/os-release").read_text(encoding="utf-8").splitlines():
        key, _, value = line.partition("=")
        release[key] = value.strip('"')
    return f"{release.get('ID', 'debian')}-{release.get('VERSION_ID', 'unknown')}"


def sbom(root: Path, *, name: str, venv: str, created: str) -> dict[str, Any]:
    """The SPDX document: one package for the image, which contains all the others."""
    distro = _distro(root)
    packages = [_deb_package(p, distro) for p in debian_packages(root)]
    packages += [_python_package(d) for d in python_distributions(root, venv)]
    image = {
        "SPDXID": "SPDXRef-image",
        "name": name,
        "downloadLocation": "NOASSERTION",
        "filesAnalyzed": False,
        "primaryPackagePurpose": "CONTAINER",
    }
    content = json.dumps(packages, sort_keys=True).encode()
    return {
        "spdxVersion": "SPDX-2.3",
        "dataLicense": "CC0-1.0",
        "SPDXID": "SPDXRef-DOCUMENT",
        "name": name,
        # Unique per content, and the same for two builds with the same content.
        "documentNamespace": f"https://spdx.org/spdxdocs/{name}-{hashlib.sha256(content).hexdigest()[:32]}",
        "creationInfo": {"created": created, "creators": ["Tool: gpuportal-build-image"]},
        "packages": [image, *packages],
        "relationships": [
            {
                "spdxElementId": "SPDXRef-DOCUMENT",
                "relationshipType": "DESCRIBES",
                "relatedSpdxElement": "SPDXRef-image",
            },
            *(
                {
                    "spdxElementId": "SPDXRef-image",
                    "relationshipType": "CONTAINS",
                    "relatedSpdxElement": p["SPDXID"],
                }
                for p in packages
            ),
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", type=Path, help="the image's root directory")
    parser.add_argument("--name", required=True, help="the document's and the image's name")
    parser.add_argument("--venv", required=True, help="the venv's path inside the root")
    parser.add_argument("--created", required=True, help="creation time, ISO 8601 UTC")
    parser.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    args = parser.parse_args()
    if not (args.root / DPKG_STATUS).is_file():
        parser.error(f"{args.root} has no {DPKG_STATUS}; expected a Debian root directory")
    document = sbom(args.root, name=args.name, venv=args.venv, created=args.created)
    args.out.write_text(json.dumps(document, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
