"""The isolation reconciler as a periodic loop of the service: tenant and quota changes in the
portal reach Kubernetes, and hand edits of our objects are undone.

Each round reads the allocator's tenants and quotas, turns them into ``TenantSpec``s
(``tenant_specs``) and, when they differ from what the last successful round applied or
``resync_s`` has passed since, runs ``reconcile``. Between resyncs an unchanged portal costs no
apiserver request, so the interval can be short (quota changes land within it) while drift is
still repaired every ``resync_s``.

A round that fails (the apiserver is down, a tenant to delete still has pods:
``TenantHasPods``) raises; the loop runner logs it and tries again next interval. Nothing is
remembered from a failed round, so the next one retries in full.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kubernetes.client import ApiClient

from policies.isolation import IsolationSettings, TenantSpec
from portal.allocator import Allocator
from portal.isolation.reconciler import ReconcileResult, reconcile
from portal.service.loops import Loop, Loops
from portal.settings import Settings

log = logging.getLogger(__name__)

LOOP_NAME = "isolation-reconcile"


@dataclass(frozen=True, slots=True)
class TenantDefaults:
    """What every tenant's namespace may hold besides GPUs (the portal has no per-tenant CPU,
    memory or pod quota yet); generous, since the allocator guards the GPUs."""

    cpu_millis: int = 256_000
    memory_mib: int = 2_097_152
    pods: int = 200
    allow_intra_tenant_traffic: bool = True
    internet_egress: bool = False


def tenant_specs(alloc: Allocator, defaults: TenantDefaults) -> list[TenantSpec]:
    """One spec per portal tenant, GPU limits from its quotas' ``limit`` (what the tenant may
    hold, borrowing included). A tenant restricted to exactly one node pool is kept on it."""
    limits: dict[str, dict[str, int]] = {}
    for q in alloc.quotas():
        limits.setdefault(q.tenant, {})[q.flavor] = q.limit
    return [
        TenantSpec(
            t.name,
            limits.get(t.name, {}),
            cpu_millis=defaults.cpu_millis,
            memory_mib=defaults.memory_mib,
            pods=defaults.pods,
            allow_intra_tenant_traffic=defaults.allow_intra_tenant_traffic,
            internet_egress=defaults.internet_egress,
            node_pool=t.pools[0] if len(t.pools) == 1 else None,
        )
        for t in alloc.tenants()
    ]


class IsolationLoop:
    """One round of reconciliation per call; see the module docstring.

    Args:
        alloc: where tenants and quotas come from.
        settings: the cluster-wide isolation settings.
        api_client: a Kubernetes client with the portal's ClusterRole.
        defaults: CPU, memory, pods and traffic of every tenant.
        resync_s: reconcile at least this often even when nothing changed (drift repair).
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        alloc: Allocator,
        settings: IsolationSettings,
        api_client: ApiClient,
        *,
        defaults: TenantDefaults | None = None,
        resync_s: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._alloc = alloc
        self._settings = settings
        self._client = api_client
        self._defaults = defaults or TenantDefaults()
        self._resync_s = resync_s
        self._clock = clock
        self._applied: Sequence[TenantSpec] | None = None
        self._applied_at = 0.0
        self.last: ReconcileResult | None = None

    def __call__(self) -> None:
        specs = tenant_specs(self._alloc, self._defaults)
        now = self._clock()
        if specs == self._applied and now - self._applied_at < self._resync_s:
            return
        result = reconcile(specs, self._settings, self._client)
        self._applied, self._applied_at, self.last = specs, now, result
        if result.changed:
            log.info(
                "isolation: %d created, %d updated, %d deleted",
                len(result.created),
                len(result.updated),
                len(result.deleted),
                extra={
                    "fields": {
                        "created": [str(r) for r in result.created],
                        "updated": [str(r) for r in result.updated],
                        "deleted": [str(r) for r in result.deleted],
                    }
                },
            )


def register(
    loops: Loops,
    alloc: Allocator,
    settings: IsolationSettings,
    api_client: ApiClient,
    *,
    interval_s: float = 10.0,
    defaults: TenantDefaults | None = None,
    resync_s: float = 300.0,
) -> Loop:
    """Add the isolation loop to ``loops`` (before they start)."""
    work = IsolationLoop(alloc, settings, api_client, defaults=defaults, resync_s=resync_s)
    return loops.add(LOOP_NAME, interval_s, work)


def register_for_service(
    loops: Loops, alloc: Allocator, settings: Settings, isolation: IsolationSettings
) -> Loop | None:
    """The service's registration: on Kubernetes (``inventory=kubernetes``) reconcile with the
    pod's service account (or the kubeconfig outside a cluster) and ``isolation`` (the service
    reads ``GPUPORTAL_ISOLATION_FILE``); elsewhere there is nothing to isolate and nothing is
    registered."""
    if settings.inventory.strip() != "kubernetes":
        return None
    import kubernetes
    from kubernetes.config.config_exception import ConfigException

    try:
        kubernetes.config.load_incluster_config()  # type: ignore[no-untyped-call]
    except ConfigException:
        kubernetes.config.load_kube_config()  # type: ignore[no-untyped-call]
    return register(loops, alloc, isolation, ApiClient())
