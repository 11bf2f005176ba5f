"""Leave the shared test cluster as a Kubernetes test module found it: its tenants' pods
and namespaces deleted.

The cluster is one per test session; a module that reconciles tenants and leaves their
namespaces behind makes the next module's reconcile (which deletes namespaces of tenants it
does not know) report deletions it did not expect, as the isolation module asserts. Every
module that reconciles tenants calls this at its end."""

from __future__ import annotations

import contextlib
from collections.abc import Collection

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.isolation import IsolationSettings
from portal.isolation import reconcile
from tests.support.waiting import eventually


def delete_tenant_namespaces(
    api: client.ApiClient, settings: IsolationSettings, namespaces: Collection[str]
) -> None:
    """Delete the pods of ``namespaces`` at once (no grace), then every namespace the portal
    manages that holds nothing (``reconcile`` with no tenants), and wait until ``namespaces``
    are gone."""
    core = client.CoreV1Api(api)
    for namespace in namespaces:
        for pod in core.list_namespaced_pod(namespace).items:
            with contextlib.suppress(ApiException):  # gone with its owner meanwhile
                core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=0)
        eventually(
            lambda ns=namespace: True if not core.list_namespaced_pod(ns).items else None,
            f"no pods left in {namespace}",
        )
    reconcile([], settings, api, force=True)
    mine = set(namespaces)

    def gone() -> bool | None:
        names = {n.metadata.name for n in core.list_namespace().items if n.metadata}
        return True if not names & mine else None

    eventually(gone, f"namespaces {sorted(mine)} deleted", timeout_s=90)
