"""The tenant's checkpoint claim on Kubernetes (``manifests.checkpoint_claim_manifest``).

One PersistentVolumeClaim per tenant namespace holds every job's checkpoints, each job in its
own sub-path. The runner makes sure it exists before it creates the Job of an attempt that
mounts it: a claim of that name already there (an admin's, on the storage they chose) is
used as it is, never changed; otherwise the portal creates it with the configured size and
StorageClass. Pods of a Job whose claim is missing would wait ``Pending`` with no word to the
job, so a claim that cannot be created fails the launch instead, saying why.
"""

from __future__ import annotations

from typing import Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.isolation import IsolationSettings
from portal.jobs.kube import manifests as m
from portal.jobs.kube.pods import api_message
from portal.jobs.runner import RunnerError


def ensure_checkpoint_claim(
    core: client.CoreV1Api, tenant: str, settings: IsolationSettings
) -> bool:
    """Create the tenant's checkpoint claim unless it exists; True when it was created.

    Raises:
        RunnerError: the apiserver refused to read or create it (the message says why).
    """
    namespace, name = settings.namespace(tenant), settings.checkpoint_claim
    try:
        core.read_namespaced_persistent_volume_claim(name, namespace, _preload_content=False)
        return False
    except ApiException as e:
        if e.status != 404:
            raise RunnerError(
                f"cannot read the checkpoint claim {namespace}/{name}: {api_message(e)}"
            ) from e
    body = m.checkpoint_claim_manifest(tenant, settings)
    try:
        core.create_namespaced_persistent_volume_claim(
            namespace, cast(Any, body), _preload_content=False
        )
    except ApiException as e:
        if e.status == 409:
            return False  # made meanwhile (another launch): use it
        raise RunnerError(
            f"cannot create the checkpoint claim {namespace}/{name}: {api_message(e)}"
        ) from e
    return True
