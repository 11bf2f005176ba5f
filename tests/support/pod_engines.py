"""STAND-IN for the engines of inference replica pods on a kwok cluster, which runs no
container: one real test-engine process (``portal.inference.testengine``) per replica, on this
host, started the first time the Kubernetes backend asks where that pod's engine is (its
``reach``). ``probe`` joins kwok's readiness, which it reports as soon as a pod is bound, with
the engine's own health path, as a kubelet's readiness probe would. Everything above that
boundary (the service controller, the warm pool's sleep and wake calls, the gateway) is the
real code."""

from __future__ import annotations

import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import httpx

from portal.inference.backend import ServiceBackend, http_probe
from tests.support.ports import LOOPBACK, free_port


class PodEngines:
    """A test engine per replica pod: ``served`` is its model name, ``load_s`` its load."""

    def __init__(self, model_dir: Path, served: str, load_s: float) -> None:
        self._dir = model_dir
        self._served = served
        self._load_s = load_s
        self._lock = threading.Lock()
        self.urls: dict[tuple[str, int], str] = {}
        self._procs: list[subprocess.Popen[bytes]] = []

    def reach(self, namespace: str, service_id: str, number: int) -> str:
        """The Kubernetes backend's ``reach``: the replica's engine, started on first ask."""
        with self._lock:
            if (service_id, number) not in self.urls:
                port = free_port()
                command = [sys.executable, "-m", "portal.inference.testengine",
                           "--model-dir", str(self._dir), "--served-model-name", self._served,
                           "--port", str(port), "--load-seconds", str(self._load_s),
                           "--token-seconds", "0.001"]  # fmt: skip
                quiet = subprocess.DEVNULL
                self._procs.append(subprocess.Popen(command, stdout=quiet, stderr=quiet))
                self.urls[(service_id, number)] = f"http://{LOOPBACK}:{port}"
            return self.urls[(service_id, number)]

    def backend(self, kube: ServiceBackend) -> ServiceBackend:
        """``kube`` (built with ``reach``) with the readiness a kubelet would report."""
        pod_ready: Callable[[str], bool] = kube.probe
        return replace(kube, probe=lambda url: pod_ready(url) and http_probe(url))

    def sleeping(self, service_id: str, number: int) -> bool:
        url = self.urls[(service_id, number)] + "/is_sleeping"
        return bool(httpx.get(url, timeout=5).json()["is_sleeping"])

    def close(self) -> None:
        for proc in self._procs:
            proc.kill()
            proc.wait()
