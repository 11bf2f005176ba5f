"""What a Ray cluster is: a frozen value checked on construction, stored as JSON.

A cluster has a head (CPU-only: ``head_cpus``) and one worker group: ``min_workers`` to
``max_workers`` workers, each with ``devices`` (one of the tenant's flavors) and
``worker_cpus``; ``workers`` is how many it should have now. Every check raises
``InvalidRequest`` naming the field as the API's body spells it (``workers.max``,
``workers.devices.models``, ``ray_version``...), so a bad cluster is a 422 and nothing is
created.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from policies.errors import InvalidRequest
from policies.ray import check_bounds
from policies.requests import MAX_GANG_SIZE, MAX_PRIORITY, DeviceRequest
from portal.allocator import codec
from portal.jobs.spec import ClusterFacts, api_field
from portal.store.records import RayClusterRecord

MAX_CPUS = 256
MAX_IDLE_S = 7 * 86_400.0


def installed_ray_version() -> str | None:
    """The version of the ``ray`` package beside the portal (read from its metadata: the
    portal never imports ray), or None when it is not installed."""
    try:
        return metadata.version("ray")
    except metadata.PackageNotFoundError:
        return None


def _worker_field(exc: InvalidRequest) -> InvalidRequest:
    named = api_field(exc)
    return InvalidRequest(f"workers.{named.field}", named.value, named.valid)


def worker_devices(data: Mapping[str, Any]) -> DeviceRequest:
    """A worker's devices from the body's ``workers.devices``."""
    try:
        return codec.device_request_from_dict(dict(data))
    except InvalidRequest as exc:
        raise _worker_field(exc) from None


@dataclass(frozen=True, slots=True)
class RaySpec:
    """A Ray cluster as asked for. ``idle_s`` None: never released for idleness; once idle
    for ``idle_s``, its workers are released and the head kept, or with ``idle_suspend``
    every node is stopped. ``autoscale``: GPU demand Ray cannot schedule grows the cluster
    (up to ``max_workers``) as ``scale`` would."""

    tenant: str
    owner: str
    name: str
    devices: DeviceRequest
    min_workers: int
    max_workers: int
    workers: int
    ray_version: str
    head_cpus: int = 1
    worker_cpus: int = 1
    idle_s: float | None = None
    priority: int = 0
    idle_suspend: bool = False
    autoscale: bool = False

    def __post_init__(self) -> None:
        if not self.name or len(self.name) > 253:
            raise InvalidRequest("name", repr(self.name), "1 to 253 characters")
        check_bounds("workers.min", self.min_workers, 0, MAX_GANG_SIZE)
        check_bounds("workers.max", self.max_workers, max(1, self.min_workers), MAX_GANG_SIZE)
        check_bounds("workers.replicas", self.workers, self.min_workers, self.max_workers)
        for what, cpus, least in (
            ("head.cpus", self.head_cpus, 1),
            ("workers.cpus", self.worker_cpus, 1),
        ):
            if isinstance(cpus, bool) or not least <= cpus <= MAX_CPUS:
                raise InvalidRequest(what, cpus, f"{least} to {MAX_CPUS} CPUs")
        if self.devices.kind is None:
            raise InvalidRequest(
                "workers.devices", "no GPU", "a GPU, MIG or share flavor: workers hold devices"
            )
        if self.idle_s is not None and not 0 < self.idle_s <= MAX_IDLE_S:
            raise InvalidRequest("idle_s", self.idle_s, f"seconds from 1 to {MAX_IDLE_S:g}")
        if self.idle_suspend and self.idle_s is None:
            raise InvalidRequest("idle_suspend", True, "false while idle_s is null")
        if self.autoscale and self.max_workers <= self.min_workers:
            raise InvalidRequest(
                "workers.autoscale", True, "false while workers.max equals workers.min"
            )
        if not -MAX_PRIORITY <= self.priority <= MAX_PRIORITY:
            raise InvalidRequest("priority", self.priority, f"{-MAX_PRIORITY} to {MAX_PRIORITY}")

    @property
    def gpus_per_worker(self) -> int:
        """``--num-gpus`` of a worker: the GPUs (or MIG instances, or the one shared GPU) it
        is pinned to."""
        return max(1, self.devices.count) if self.devices.kind is not None else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "devices": codec.device_request_to_dict(self.devices),
            "min_workers": self.min_workers,
            "max_workers": self.max_workers,
            "workers": self.workers,
            "ray_version": self.ray_version,
            "head_cpus": self.head_cpus,
            "worker_cpus": self.worker_cpus,
            "idle_s": self.idle_s,
            "priority": self.priority,
            "idle_suspend": self.idle_suspend,
            "autoscale": self.autoscale,
        }

    @classmethod
    def from_dict(cls, tenant: str, owner: str, name: str, data: Mapping[str, Any]) -> RaySpec:
        return cls(
            tenant=tenant,
            owner=owner,
            name=name,
            devices=worker_devices(data["devices"]),
            min_workers=data["min_workers"],
            max_workers=data["max_workers"],
            workers=data["workers"],
            ray_version=data["ray_version"],
            head_cpus=data["head_cpus"],
            worker_cpus=data["worker_cpus"],
            idle_s=data["idle_s"],
            priority=data["priority"],
            # Clusters recorded before idle release existed have no such key.
            idle_suspend=bool(data.get("idle_suspend", False)),
            autoscale=bool(data.get("autoscale", False)),
        )


def check_version(version: str, installed: str | None) -> None:
    """Only the Ray beside the portal can run: its version is the one valid value."""
    if installed is None:
        raise InvalidRequest(
            "ray_version", version, "none: the ray package is not installed beside the portal"
        )
    if version != installed:
        raise InvalidRequest("ray_version", version, f"{installed} (the installed ray)")


def candidate_flavors(devices: DeviceRequest, models: Collection[str]) -> list[str]:
    """The flavors a worker could be counted as: one per model it may run on."""
    return sorted(
        str(fl) for m in sorted(devices.models or models) if (fl := devices.flavor(m)) is not None
    )


def check_tenant_flavors(
    devices: DeviceRequest, facts: ClusterFacts, quotas: Collection[str]
) -> None:
    """The worker's flavor is one the tenant has quota for (a flavor it may not use would
    wait forever)."""
    flavors = candidate_flavors(devices, facts.models)
    if not any(fl in quotas for fl in flavors):
        raise InvalidRequest(
            "workers.devices.models",
            ", ".join(flavors) or "no flavor",
            "a flavor the tenant has quota for: " + (", ".join(sorted(quotas)) or "none"),
        )


def fits_cluster(spec: RaySpec, facts: ClusterFacts) -> None:
    """Refuse a worker group no cluster state could ever hold: more workers' worth of the
    flavor than the whole inventory has."""
    flavors = [fl for fl in candidate_flavors(spec.devices, facts.models) if fl in facts.capacity]
    if not flavors:
        return
    per = spec.devices.amount()
    most = max(facts.capacity[fl] for fl in flavors)
    if per * spec.max_workers > most:
        raise InvalidRequest(
            "workers.max",
            spec.max_workers,
            f"at most {most // per} workers of {per} x {flavors[0]}: the whole cluster holds "
            f"{most}",
        )


def cluster_spec(cluster: RayClusterRecord) -> RaySpec:
    """The spec a recorded cluster holds now (``workers`` its current count)."""
    return RaySpec.from_dict(cluster.tenant, cluster.owner, cluster.name, cluster.spec)
