"""Checks an allocator operation makes before it decides anything: the request can ever fit
and be admitted, a quota edit stays within the platform's ceilings and capacity.

They read the state (or a draft) and raise the typed error a person can act on; they change
nothing.
"""

from __future__ import annotations

from policies.errors import Forbidden, InvalidRequest
from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadRequest
from portal.allocator.memory import InventoryFacts, Memory, ModelFacts


def within_ceiling(
    tenant: str, flavor: str, guaranteed: int, limit: int, ceiling_g: int, ceiling_l: int
) -> None:
    """A tenant admin's edit stays within the platform admin's ceilings."""
    for what, value, ceiling in (
        ("guaranteed", guaranteed, ceiling_g),
        ("limit", limit, ceiling_l),
    ):
        if value > ceiling:
            raise Forbidden(
                f"{tenant}'s ceiling for {flavor} {what} is {ceiling} (set by a platform "
                f"admin); {what} {value} is above it: ask a platform admin to raise the ceiling"
            )


def guarantees_fit(draft: Memory, tenant: str, flavor: str, guaranteed: int) -> None:
    """Guarantees are promises: their sum over the tenants may not pass the flavor's
    capacity, or reclaiming one tenant's guarantee would have to break another's."""
    others = sum(
        q.guaranteed for (t, fl), q in draft.quotas.items() if fl == flavor and t != tenant
    )
    capacity = draft.capacity().get(flavor, 0)
    if others + guaranteed > capacity:
        raise InvalidRequest(
            "guaranteed",
            guaranteed,
            f"at most {max(0, capacity - others)}: the guarantees of {flavor} would add up to "
            f"{others + guaranteed} on a capacity of {capacity} (other tenants guarantee "
            f"{others}); a platform admin may over-commit explicitly (overcommit: true)",
        )


def request_can_fit(state: Memory, req: WorkloadRequest) -> None:
    """Static checks against the inventory: models exist, the shape can ever fit, and some
    quota of the tenant could ever admit it."""
    dev = req.devices
    facts = state.facts()
    known = facts.models
    unknown = sorted(set(dev.models) - known)
    if dev.kind is not None and unknown:
        raise InvalidRequest(
            "GPU model", ", ".join(unknown), "one of " + (", ".join(sorted(known)) or "none")
        )
    _fits_some_node(facts, dev)
    models = state.models_for(req) if dev.kind is not None else []
    if dev.kind is not None and not models:
        raise InvalidRequest(
            "request",
            f"{dev.kind.value} on {sorted(dev.models) or 'any model'}",
            "a flavor the inventory offers: " + ", ".join(sorted(state.capacity())),
        )
    if models:
        _quota_allows(state, req, models)


def _fits_some_node(facts: InventoryFacts, dev: DeviceRequest) -> None:
    """Refuse a shape no node of the requested models could ever hold (it would wait
    forever), naming the field and the largest value that could fit."""
    if dev.kind is None:
        where = "the largest node"
        most = ModelFacts(0, 0, facts.max_cpu_milli, facts.max_memory_mib)
    else:
        candidates = [facts.per_model[m] for m in sorted(dev.models or facts.models)]
        if not candidates:
            return  # no such model: the flavor check names what exists
        names = sorted(dev.models) if dev.models else ["any model"]
        where = "/".join(names)
        most = ModelFacts(
            max(c.gpus for c in candidates),
            max(c.gpu_memory_mib for c in candidates),
            max(c.cpu_milli for c in candidates),
            max(c.memory_mib for c in candidates),
        )
    if dev.kind is FlavorKind.GPU and dev.count > most.gpus:
        raise InvalidRequest(
            "GPU count", dev.count, f"at most {most.gpus} (the most {where} GPUs on one node)"
        )
    if dev.kind is FlavorKind.SHARE and dev.gpu_memory_mib > most.gpu_memory_mib:
        raise InvalidRequest(
            "gpu_memory_mib",
            dev.gpu_memory_mib,
            f"at most {most.gpu_memory_mib} (the memory of one {where} GPU)",
        )
    scope = f"a node with {where} GPUs" if dev.kind is not None else where
    if dev.cpu_milli > most.cpu_milli:
        raise InvalidRequest("cpu_milli", dev.cpu_milli, f"at most {most.cpu_milli} ({scope})")
    if dev.memory_mib > most.memory_mib:
        raise InvalidRequest("memory_mib", dev.memory_mib, f"at most {most.memory_mib} ({scope})")


def _quota_allows(state: Memory, req: WorkloadRequest, models: list[str]) -> None:
    """Refuse what no quota of the tenant could ever admit (no quota for any candidate
    flavor, or more than its limit) instead of queueing it forever; the spawner's offers call
    the same cases "not allowed"."""
    amount = req.devices.amount() * req.gang_size
    why = []
    for m in models:
        fl = str(req.devices.flavor(m))
        q = state.quotas.get((req.tenant, fl))
        if q is not None and 0 < amount <= q.limit:
            return
        why.append(f"{fl}: " + (f"limit {q.limit}" if q is not None else "no quota"))
    raise Forbidden(
        f"{req.tenant} can never be given {amount} of what {req.name or 'this request'} "
        f"asks for ({'; '.join(why)}); ask a tenant admin for quota"
    )
