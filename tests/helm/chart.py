"""Running the pinned ``helm`` on the chart in helm/gpuportal: render, lint, and pick objects
out of what it rendered."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from policies.isolation import IsolationSettings, isolation_settings
from tests.support.k8s import REPO_ROOT, locate_binaries

CHART = REPO_ROOT / "helm" / "gpuportal"
EXAMPLES = CHART / "examples"
PRODUCTION_VALUES = EXAMPLES / "production-values.yaml"
INSTALL_VALUES = EXAMPLES / "install-values.yaml"  # the install guide's (docs/helm.md)
Z2JH_VALUES = EXAMPLES / "z2jh-values.yaml"
WORKLOAD_KINDS = frozenset({"Deployment", "DaemonSet", "StatefulSet", "Job"})

Manifest = dict[str, Any]


def find_helm() -> Path:
    """The helm binary built by scripts/build-k8s-tools (building it first if needed)."""
    helm = locate_binaries() / "helm"
    if not helm.is_file():
        raise FileNotFoundError(f"{helm} is missing: run scripts/build-k8s-tools")
    return helm


@dataclass(frozen=True, slots=True)
class Helm:
    """The pinned helm, run with a private home so no user configuration leaks in."""

    binary: Path
    home: Path

    def run(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            "HOME": str(self.home),
            "PATH": "/usr/bin:/bin",
            "HELM_CACHE_HOME": str(self.home / "cache"),
            "HELM_CONFIG_HOME": str(self.home / "config"),
            "HELM_DATA_HOME": str(self.home / "data"),
        }
        return subprocess.run(
            [str(self.binary), *args], env=env, capture_output=True, text=True, timeout=120
        )

    def template(
        self,
        *,
        release: str = "gpuportal",
        namespace: str = "gpuportal",
        values_files: Sequence[Path] = (),
        sets: Mapping[str, str] = {},
    ) -> subprocess.CompletedProcess[str]:
        args = ["template", release, str(CHART), "--namespace", namespace]
        for f in values_files:
            args += ["--values", str(f)]
        for key, value in sets.items():
            args += ["--set-json", f"{key}={value}"]
        return self.run(*args)

    def render(self, **kwargs: Any) -> list[Manifest]:
        """``helm template`` that must succeed; the rendered objects in order."""
        proc = self.template(**kwargs)
        assert proc.returncode == 0, f"helm template failed:\n{proc.stderr}"
        return [d for d in yaml.safe_load_all(proc.stdout) if d]


def named(objects: Iterable[Manifest], kind: str, name: str) -> Manifest:
    """The one object of ``kind`` called ``name``."""
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
    return found[0]


def kinds_and_names(objects: Iterable[Manifest]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


def pod_templates(objects: Iterable[Manifest]) -> dict[str, Manifest]:
    """The pod template of every workload, by workload name."""
    return {
        o["metadata"]["name"]: o["spec"]["template"] for o in objects if o["kind"] in WORKLOAD_KINDS
    }


def env_of(pod_template: Manifest, container: str) -> dict[str, Any]:
    """A container's environment: name -> value, or the valueFrom mapping."""
    (c,) = [c for c in pod_template["spec"]["containers"] if c["name"] == container]
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in c.get("env", [])}


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def isolation_of(objects: Iterable[Manifest]) -> IsolationSettings:
    """The isolation settings the rendered chart gives its portal (its ``-isolation``
    ConfigMap), read as the service reads them."""
    (found,) = [
        o
        for o in objects
        if o["kind"] == "ConfigMap" and o["metadata"]["name"].endswith("-isolation")
    ]
    return isolation_settings(yaml.safe_load(found["data"]["isolation.yaml"]))
