"""The service controller's side of the weight cache (``portal.inference.weights``): which
entries running replicas use, where a replica about to start finds its weights, and the words
that say why a start was cold."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime

from policies.services import ModelRef, ReplicaState
from portal.inference.backend import ServiceBackend
from portal.inference.weights import CacheEntry
from portal.store import services as stored
from portal.store.records import ServiceRecord
from portal.store.writer import Store

HAS_PROCESS = frozenset(
    {ReplicaState.STARTING, ReplicaState.READY, ReplicaState.ASLEEP, ReplicaState.STOPPING}
)
FIRST = "cold: first replica, the weights were on no node yet"
NO_ROOM = "cold: weights not cached on any node with room"


def model_of(svc: ServiceRecord) -> ModelRef:
    model = svc.spec["model"]
    assert isinstance(model, dict)
    return ModelRef(str(model["uri"]), str(model["digest"]))


def in_use(store: Store) -> frozenset[tuple[str, str]]:
    """(node, digest) of every replica that has (or may still have) a process: its weights
    are mounted and must not be evicted. Read from the store, so it survives a restart."""
    used: set[tuple[str, str]] = set()
    for svc in stored.unsettled_services(store):
        digest = model_of(svc).digest
        for r in stored.replicas(store, svc.id, live=True):
            if r.state in HAS_PROCESS and r.node is not None:
                used.add((r.node, digest))
    return frozenset(used)


def holders(backend: ServiceBackend | None, digest: str, tenant: str) -> frozenset[str]:
    """The nodes whose cache holds ``digest`` for ``tenant`` (any tenant's copy, where
    tenants share copies): where placement tries a replica first."""
    if backend is None or backend.weights is None:
        return frozenset()
    mine = (tenant,) if backend.weights.per_tenant else None
    return frozenset(e.node for e in backend.weights.entries((), mine) if e.digest == digest)


@dataclass(frozen=True, slots=True)
class ReplicaWeights:
    """Where a replica finds its model (None: the URI's own folder, or the engine fetches
    it), how its start was, and whether they are there yet (a fetch on the node may run)."""

    path: str | None
    how: str
    ready: bool = True


def replica_weights(
    backend: ServiceBackend, store: Store, svc: ServiceRecord, node: str, now: datetime
) -> ReplicaWeights:
    """The folder a replica of ``svc`` on ``node`` serves, and how its start was: warm, or
    why cold (see ``ReplicaWeights``).

    Raises:
        PortalError: the weights cannot be had (see ``Weights.ensure``).
    """
    model = model_of(svc)
    if backend.weights is None or not backend.weights.caches(model.uri):
        return ReplicaWeights(None, "")
    got = backend.weights.ensure(node, svc.tenant, model, in_use(store), now)
    if not got.ready:
        return ReplicaWeights(str(got.path), "", ready=False)
    if not got.cold:
        return ReplicaWeights(str(got.path), f"weights cached on {node}")
    why = NO_ROOM if holders(backend, model.digest, svc.tenant) - {node} else FIRST
    fetched = f"fetched {got.fetched_bytes} bytes" if got.fetched_bytes else f"fetched on {node}"
    return ReplicaWeights(str(got.path), f"{why}: {fetched}")


def listing(
    backend: ServiceBackend | None, store: Store, tenants: Collection[str] | None
) -> list[CacheEntry]:
    """The cache's entries per node and tenant (only ``tenants``' when given)."""
    if backend is None or backend.weights is None:
        return []
    return backend.weights.entries(in_use(store), tenants)
