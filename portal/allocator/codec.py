"""Conversions between policy values and the records the store persists."""

from __future__ import annotations

from typing import Any

from policies.errors import InvalidRequest
from policies.flavors import FlavorKind
from policies.placement.state import Placement
from policies.requests import DeviceRequest, TopologyRequirement, WorkloadKind, WorkloadRequest
from portal.store.records import AllocationRecord


def device_request_to_dict(d: DeviceRequest) -> dict[str, object]:
    return {
        "kind": d.kind.value if d.kind is not None else None,
        "count": d.count,
        "models": sorted(d.models),
        "mig_profile": d.mig_profile,
        "milli": d.milli,
        "gpu_memory_mib": d.gpu_memory_mib,
        "cpu_milli": d.cpu_milli,
        "memory_mib": d.memory_mib,
        "topology": d.topology.value,
    }


def _int(data: dict[str, Any], key: str) -> int:
    value = data.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(key, repr(value), "an integer")
    return value


def device_request_from_dict(data: dict[str, Any]) -> DeviceRequest:
    """Build a request from JSON-like data; every bad field raises ``InvalidRequest``."""
    if not isinstance(data, dict):
        raise InvalidRequest("devices", repr(data), "an object")
    known = {
        "kind",
        "count",
        "models",
        "mig_profile",
        "milli",
        "gpu_memory_mib",
        "cpu_milli",
        "memory_mib",
        "topology",
    }
    extra = sorted(set(data) - known)
    if extra:
        raise InvalidRequest(
            "devices field", ", ".join(extra), "one of " + ", ".join(sorted(known))
        )
    kind_raw = data.get("kind")
    try:
        kind = FlavorKind(kind_raw) if kind_raw is not None else None
    except ValueError:
        raise InvalidRequest(
            "devices.kind",
            repr(kind_raw),
            "null or one of " + ", ".join(k.value for k in FlavorKind),
        ) from None
    models_raw = data.get("models", [])
    if not isinstance(models_raw, list | tuple) or not all(isinstance(m, str) for m in models_raw):
        raise InvalidRequest("devices.models", repr(models_raw), "a list of GPU model names")
    topo_raw = data.get("topology", TopologyRequirement.ANY.value)
    try:
        topo = TopologyRequirement(topo_raw)
    except ValueError:
        raise InvalidRequest(
            "devices.topology", repr(topo_raw), ", ".join(t.value for t in TopologyRequirement)
        ) from None
    profile = data.get("mig_profile")
    if profile is not None and not isinstance(profile, str):
        raise InvalidRequest("devices.mig_profile", repr(profile), "a profile name or null")
    return DeviceRequest(
        kind=kind,
        count=_int(data, "count"),
        models=frozenset(models_raw),
        mig_profile=profile,
        milli=_int(data, "milli"),
        gpu_memory_mib=_int(data, "gpu_memory_mib"),
        cpu_milli=_int(data, "cpu_milli"),
        memory_mib=_int(data, "memory_mib"),
        topology=topo,
    )


def workload_request_from_record(
    tenant: str, owner: str, name: str, kind: str, request: dict[str, Any], gang: int, prio: int
) -> WorkloadRequest:
    return WorkloadRequest(
        tenant=tenant,
        owner=owner,
        name=name,
        devices=device_request_from_dict(dict(request)),
        kind=WorkloadKind(kind),
        gang_size=gang,
        priority=prio,
    )


def placement_of(a: AllocationRecord) -> Placement:
    return Placement(
        node=a.node,
        gpus=a.gpus,
        milli=a.milli,
        gpu_memory_mib=a.gpu_memory_mib,
        mig_profile=a.mig_profile,
        mig_start=a.mig_start,
        mig_created=False,
        cpu_milli=a.cpu_milli,
        memory_mib=a.memory_mib,
    )
