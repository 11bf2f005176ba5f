"""The binder and the sweep as loops of ``gpuportal serve`` on Kubernetes.

Registered when the inventory comes from the cluster (``GPUPORTAL_INVENTORY=kubernetes``): the
same credentials that read the nodes bind the pods (in the cluster the portal's ServiceAccount,
outside it the kubeconfig).
"""

from __future__ import annotations

from collections.abc import Callable

from kubernetes import client, config
from kubernetes.config.config_exception import ConfigException

from policies.isolation import IsolationSettings
from portal.kube.binder import ACT_WORKERS, Binder
from portal.kube.sweep import Sweeper
from portal.kube.views import AllocationSource
from portal.service.loops import Loops
from portal.settings import Settings

BIND_INTERVAL_S = 1.0
"""Seconds between binding passes: at most this long between a pod's creation and its bind."""
SWEEP_INTERVAL_S = 10.0
"""Seconds between sweeps for pods deleted behind the hub's back."""
SWEEP_GRACE_S = 300.0
"""How long an allocation without any pod seen is left alone (the spawner creates the pod
right after the allocation; a restarted portal has seen none yet)."""

AddLoop = Callable[[str, float, Callable[[], None]], object]
"""``Loops.add`` of ``portal.service.loops``."""


def cluster_client() -> client.ApiClient:
    """A client with the pod's ServiceAccount in the cluster, else the kubeconfig's user."""
    configuration = client.Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    except ConfigException:
        config.load_kube_config(client_configuration=configuration)  # type: ignore[no-untyped-call]
    # The client keeps 5 connections per core by default: fewer than the binder's workers
    # alone on a small host, and a call finding the pool full opens (and drops) a new TLS
    # connection. Room for the binder's pool and the other loops beside it.
    configuration.connection_pool_maxsize = max(
        configuration.connection_pool_maxsize, 2 * ACT_WORKERS
    )
    return client.ApiClient(configuration)


def register(
    add: AddLoop,
    source: AllocationSource,
    *,
    settings: IsolationSettings | None = None,
    api_client: client.ApiClient | None = None,
) -> tuple[Binder, Sweeper]:
    """Add the ``kube-binder`` and ``kube-sweep`` loops with ``add`` (``Loops.add``)."""
    api = api_client or cluster_client()
    isolation = settings or IsolationSettings()
    binder = Binder(api, source, isolation)
    sweeper = Sweeper(api, source, isolation, grace_s=SWEEP_GRACE_S)

    def bind() -> None:
        binder.bind_pending()

    def sweep() -> None:
        sweeper.sweep()

    add("kube-binder", BIND_INTERVAL_S, bind)
    add("kube-sweep", SWEEP_INTERVAL_S, sweep)
    return binder, sweeper


def register_for_service(
    loops: Loops, source: AllocationSource, settings: Settings, isolation: IsolationSettings
) -> tuple[Binder, Sweeper] | None:
    """The service's registration: on Kubernetes (``inventory=kubernetes``) only, with the
    isolation loop's settings (``isolation``); elsewhere no pod needs binding and nothing is
    registered."""
    if settings.inventory.strip() != "kubernetes":
        return None
    return register(loops.add, source, settings=isolation)
