"""The local backend of services: each replica is an engine process on this host, pinned
with ``CUDA_VISIBLE_DEVICES``, listening on a loopback port of its own.

It reuses the jobs' ``LocalRunner`` (``portal.jobs.runner``) unchanged: a replica is run as
the one member (rank 0) of "attempt" ``number`` of "job" ``service_id``, so it gets the same
wrapper in a session of its own (its process group is what ``stop`` signals), its log and
pid records under the state directory, and re-adoption by a restarted portal (``adopt``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx

from portal.inference.spec import Backend as BackendKind
from portal.inference.spec import ServiceSpec
from portal.inference.weights import Weights
from portal.jobs.backend import Runner
from portal.jobs.launch import free_port, visible_devices
from portal.jobs.runner import LocalRunner, MemberLaunch
from portal.store.records import AllocationRecord

LOOPBACK = "127.0.0.1"
PROBE_TIMEOUT_S = 0.5
POST_TIMEOUT_S = 5.0

HEALTH_PATH_ENV = "GPUPORTAL_HEALTH_PATH"
"""A replica's variable naming its engine's health path (on Kubernetes, the path of the pod's
readiness probe)."""

Probe = Callable[[str], bool]
"""Whether the engine at a URL (its health path included) answers 200."""


_engines: httpx.Client | None = None


def _client() -> httpx.Client:
    """One client for every call to engines: a new one per call would build its TLS context
    each time (about 0.1 s), a wake's whole budget."""
    global _engines
    if _engines is None:
        _engines = httpx.Client()
    return _engines


def http_probe(url: str) -> bool:
    try:
        return _client().get(url, timeout=PROBE_TIMEOUT_S).status_code == 200
    except httpx.HTTPError:
        return False


def http_post(url: str) -> bool:
    """POST without a body (an engine's ``/sleep``, ``/wake_up``): whether it answered 2xx."""
    try:
        return _client().post(url, timeout=POST_TIMEOUT_S).is_success
    except httpx.HTTPError:
        return False


@dataclass(frozen=True, slots=True)
class ServiceBackend:
    """What the service controller uses of a backend: the runner of engine processes, where
    they listen, a folder to run them in, the health probe and the sleep and wake calls, and
    the weight cache (None: replicas serve a ``file://`` model's folder itself, and engines
    fetch other URIs).

    The local backend gives each engine a free loopback port of this host. A backend whose
    replicas each have a network of their own (Kubernetes: a pod each) sets ``port``, the one
    port every engine listens on, ``bind`` (the ``{host}`` engines listen on) and
    ``endpoint``, the base URL of replica ``(service_id, number)``'s engine: where the
    gateway sends its requests and the warm pool its sleep and wake calls."""

    kind: BackendKind
    runner: Runner
    workdir: Path
    host: str = LOOPBACK
    probe: Probe = http_probe
    post: Probe = http_post
    weights: Weights | None = None
    port: int | None = None
    bind: str | None = None
    endpoint: Callable[[str, int], str] | None = None

    def url(self, port: int, service_id: str = "", number: int = 0) -> str:
        """The base URL of replica ``number`` of ``service_id``, listening on ``port``."""
        if self.endpoint is not None:
            return self.endpoint(service_id, number)
        return f"http://{self.host}:{port}"


def local_backend(state_dir: Path, weights: Weights | None = None) -> ServiceBackend:
    state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    return ServiceBackend(BackendKind.LOCAL, LocalRunner(state_dir), state_dir, weights=weights)


def hub_id(uri: str) -> str:
    """What engines take for a model: an ``hf://`` URI's repository id (they fetch it from
    the Hugging Face Hub themselves), any other URI as it is."""
    return uri.removeprefix("hf://")


def fill(arg: str, values: dict[str, str]) -> str:
    for key, value in values.items():
        arg = arg.replace("{" + key + "}", value)
    return arg


def replica_launch(
    backend: ServiceBackend,
    service_id: str,
    number: int,
    spec: ServiceSpec,
    allocation: AllocationRecord,
    port: int | None = None,
    model_path: str | None = None,
) -> tuple[MemberLaunch, int]:
    """The engine process of replica ``number`` serving ``model_path`` (default: the
    model's own folder, or its URI), and the port it will listen on."""
    if port is None:
        port = backend.port if backend.port is not None else free_port(backend.host)
    engine = spec.engine.resolved
    values = {
        "model": model_path or spec.model.local_path or hub_id(spec.model.uri),
        "name": spec.served_name,
        "port": str(port),
        "host": backend.bind or backend.host,
    }
    env = {
        **dict(spec.engine.env),
        "GPUPORTAL_SERVICE_ID": service_id,
        "GPUPORTAL_REPLICA": str(number),
        HEALTH_PATH_ENV: engine.health_path,
        "PORT": str(port),
    }
    launch = MemberLaunch(
        job_id=service_id,
        attempt=number,
        rank=0,
        node=allocation.node,
        devices=visible_devices(allocation),
        command=tuple(fill(a, values) for a in engine.command),
        cwd=str(backend.workdir),
        env=env,
        image=engine.image or None,
        tenant=spec.tenant,
        allocation=allocation,
        weights=spec.model.digest if model_path is not None else None,
    )
    return launch, port
