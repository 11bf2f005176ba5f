"""The portal as the chart's rendered Deployment runs it, as a local process: what a kubelet
would give the container, read from the manifest and from the apiserver the chart was applied
to (Secrets, ConfigMaps, a ServiceAccount token), with the few differences a process outside
the cluster needs spelled out in one place (``OUTSIDE_THE_CLUSTER``)."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from kubernetes import client

from tests.helm.chart import Manifest
from tests.support.k8s import REPO_ROOT, K8sCluster, kubeconfig
from tests.support.ports import free_port

START_TIMEOUT_S = 90.0
# What differs from the pod, and why: the process listens on loopback on a port of its own
# (8000 may be taken here), reaches the hub at the test hub's address rather than the `hub`
# Service's DNS name, and reads its ServiceAccount's token from a kubeconfig rather than the
# projected volume (the in-cluster loader needs the pod's environment and files).
OUTSIDE_THE_CLUSTER = frozenset(
    {
        "GPUPORTAL_SERVICE_IP",
        "GPUPORTAL_SERVICE_PORT",
        "GPUPORTAL_HUB_API_URL",
        "JUPYTERHUB_API_URL",
        "KUBECONFIG",
    }
)


def service_account_kubeconfig(
    cluster: K8sCluster, core: Any, namespace: str, account: str, path: Path
) -> Path:
    """A kubeconfig holding a token of ``account`` from the TokenRequest API (what the kubelet
    projects into a pod), so the process has that ServiceAccount's RBAC and nothing more."""
    request = client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600)
    )
    token = core.create_namespaced_service_account_token(account, namespace, request).status.token
    path.write_text(
        yaml.safe_dump(kubeconfig(cluster.server, cluster.ca_path, account, token=token))
    )
    return path


def _secret_value(core: Any, namespace: str, ref: dict[str, Any]) -> str | None:
    try:
        secret = core.read_namespaced_secret(ref["name"], namespace)
    except client.exceptions.ApiException as missing:
        if missing.status == 404 and ref.get("optional"):
            return None
        raise
    data = secret.data or {}
    if ref["key"] not in data:
        assert ref.get("optional"), f"Secret {ref['name']} has no key {ref['key']}"
        return None
    return base64.b64decode(data[ref["key"]]).decode()


@dataclass
class RenderedPortal:
    """The Deployment's portal container as a process under ``root`` (its volumes' files)."""

    deployment: Manifest
    namespace: str
    root: Path
    pod_name: str = "gpuportal-0"
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def container(self) -> Manifest:
        (portal,) = [
            c
            for c in self.deployment["spec"]["template"]["spec"]["containers"]
            if c["name"] == "portal"
        ]
        return portal

    @property
    def prefix(self) -> str:
        return str(self.env_values()["GPUPORTAL_SERVICE_PREFIX"])

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.prefix}"

    @property
    def log(self) -> Path:
        return self.root / "portal.log"

    def env_values(self) -> dict[str, Any]:
        return {e["name"]: e.get("value") for e in self.container["env"]}

    def mounts(self, core: Any) -> dict[str, Path]:
        """Each mount path -> a local folder with what the pod would see there: a ConfigMap's
        keys as files, an emptyDir (or the state volume) empty."""
        volumes = {v["name"]: v for v in self.deployment["spec"]["template"]["spec"]["volumes"]}
        found: dict[str, Path] = {}
        for mount in self.container["volumeMounts"]:
            local = self.root / "volumes" / mount["name"]
            local.mkdir(parents=True, exist_ok=True)
            volume = volumes[mount["name"]]
            if "configMap" in volume:
                config_map = core.read_namespaced_config_map(
                    volume["configMap"]["name"], self.namespace
                )
                for key, text in (config_map.data or {}).items():
                    (local / key).write_text(text)
            else:
                assert "emptyDir" in volume or "persistentVolumeClaim" in volume, volume
            found[mount["mountPath"]] = local
        return found

    def environment(self, core: Any, mounts: dict[str, Path]) -> dict[str, str]:
        """The container's environment as the kubelet builds it: values, Secret keys and the
        pod's name; paths under a mount point moved to its local folder."""
        env: dict[str, str] = {}
        for item in self.container["env"]:
            source = item.get("valueFrom")
            if source is None:
                value: str | None = item["value"]
            elif "secretKeyRef" in source:
                value = _secret_value(core, self.namespace, source["secretKeyRef"])
            else:
                assert source == {"fieldRef": {"fieldPath": "metadata.name"}}, source
                value = self.pod_name
            if value is not None:
                env[item["name"]] = self.local_path(value, mounts)
        return env

    @staticmethod
    def local_path(value: str, mounts: dict[str, Path]) -> str:
        for mount_path, local in mounts.items():
            if value == mount_path or value.startswith(mount_path.rstrip("/") + "/"):
                return str(local) + value[len(mount_path.rstrip("/")) :]
        return value

    def start(self, core: Any, hub_api_url: str, kubeconfig_path: Path) -> None:
        """Start ``command`` + ``args`` with the pod's environment and the differences of
        ``OUTSIDE_THE_CLUSTER``, and wait for the readiness probe's path to answer 200."""
        outside = {
            "GPUPORTAL_SERVICE_IP": "127.0.0.1",
            "GPUPORTAL_SERVICE_PORT": str(self.port),
            "GPUPORTAL_HUB_API_URL": hub_api_url,
            "JUPYTERHUB_API_URL": hub_api_url,
            "KUBECONFIG": str(kubeconfig_path),
        }
        assert set(outside) == OUTSIDE_THE_CLUSTER
        mounts = self.mounts(core)
        env = {
            k: v for k, v in os.environ.items() if not k.startswith(("GPUPORTAL_", "JUPYTERHUB_"))
        }
        env.update(self.environment(core, mounts))
        env.update(outside, NO_PROXY="*", no_proxy="*")
        assert self.container["command"] == ["gpuportal"]
        # `gpuportal` is the package's console script: the same entry point from this checkout.
        argv = [sys.executable, "-m", "portal.cli"]
        argv += [self.local_path(a, mounts) for a in self.container["args"]]
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                argv, env=env, cwd=REPO_ROOT, stdout=out, stderr=subprocess.STDOUT
            )
        probe = self.container["readinessProbe"]["httpGet"]["path"]
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.process.poll() is None, f"the portal exited:\n{self.tail()}"
            try:
                if httpx.get(f"http://127.0.0.1:{self.port}{probe}", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"the portal was not ready in {START_TIMEOUT_S} s:\n{self.tail()}")

    def stop(self) -> int | None:
        """SIGTERM, as the kubelet sends it; the exit code (None if it was not running)."""
        process, self.process = self.process, None
        if process is None:
            return None
        process.send_signal(signal.SIGTERM)
        try:
            return process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(15)
            return None

    def tail(self, lines: int = 60) -> str:
        text = self.log.read_text(errors="replace") if self.log.exists() else ""
        return "\n".join(text.splitlines()[-lines:])
