"""``GPUKubeSpawner``: KubeSpawner, with the server's pod in its tenant's namespace on exactly the
devices the portal allocated.

The mixin (``spawner.mixin``) allocates first (queueing visibly if it must); then KubeSpawner
starts with

- ``namespace`` set to the tenant's namespace (``<tenant_namespace_prefix><tenant>``, the
  namespace the isolation reconciler keeps) before KubeSpawner starts its pod and event
  reflectors: KubeSpawner keys its shared reflectors by namespace, so every tenant namespace a
  server runs in gets its own watch, and a restarted hub re-creates it from the namespace kept in
  the server's state;
- the pod KubeSpawner builds turned into the allocation's pod by ``spawner.pod``: scheduler name
  ``gpuportal``, the device-plugin resources, tenant/workload/allocation labels, the tenant's
  token-less ServiceAccount and the restricted security context. CPU-only servers get the
  namespace, identity and security context, and the default scheduler.

The portal's binder (``portal.kube.binder``, in ``gpuportal serve``) then binds the pod to the
allocator's node; KubeSpawner waits for it to run as usual and shows the binder's Events if it
waits.

With ``pin_devices_with_dra`` (clusters serving ``resource.k8s.io/v1`` with NVIDIA's DRA driver),
whole GPUs and MIG instances are pinned by a ResourceClaim instead: the pod references the claim
and keeps the default scheduler with a required affinity to the allocator's node, and once the
pod exists the spawner creates the claim (``create_claim``, KubeSpawner's
``after_pod_created_hook``) owned by the pod, so it goes when the pod goes. See
docs/kubernetes.md.
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from kubespawner import KubeSpawner
from kubespawner.clients import shared_client
from tornado import web
from traitlets import Bool, Int, Unicode, default

from policies.errors import PortalError
from policies.isolation import IsolationSettings
from spawner.mixin import GPUAllocation, GPUPortalMixin, allocation_env
from spawner.pod import (
    DraSettings,
    PodPlacement,
    PodSettings,
    place_pod,
    resource_claim,
    tenant_pod,
)

NOTEBOOK_CONTAINER = "notebook"
"""The name KubeSpawner gives the server's container."""


class GPUKubeSpawner(GPUPortalMixin, KubeSpawner):  # type: ignore[misc]
    """Kubernetes pods on the devices the portal allocated (see the module docstring)."""

    tenant_namespace_prefix = Unicode(
        "gp-",
        config=True,
        help="""Tenant `t`'s servers run in namespace `<prefix>t`. Must match the isolation
        reconciler's `namespace_prefix`, which creates those namespaces.""",
    )
    portal_label_prefix = Unicode(
        "gpuportal.io/",
        config=True,
        help="""Prefix of the tenant, workload and allocation labels on GPU pods; the portal's
        binder reads the same keys. Must match the portal's `label_prefix`.""",
    )
    tenant_service_account = Unicode(
        "tenant-jobs",
        config=True,
        help="""ServiceAccount the servers run as in their tenant's namespace (created by the
        isolation reconciler, with no token and no role).""",
    )
    shared_gpu_resource = Unicode(
        "nvidia.com/gpu.shared",
        config=True,
        help="Device-plugin resource name of time-sliced GPU shares (fractional flavors).",
    )
    shared_gpu_replicas = Int(
        10,
        config=True,
        help="""Shares the device plugin advertises per GPU (its `replicas`); a share of the
        allocator's milli-GPU asks for ceil(milli * replicas / 1000) of them.""",
    )
    notebook_uid = Int(
        1000,
        config=True,
        help="User id of the server when the pod names none (restricted Pod Security needs a "
        "non-root one).",
    )
    notebook_gid = Int(100, config=True, help="Group id (and fsGroup) when the pod names none.")
    pin_devices_with_dra = Bool(
        False,
        config=True,
        help="""Pin whole GPUs and MIG instances with a DRA ResourceClaim selecting the allocated
        devices by UUID (needs resource.k8s.io/v1, NVIDIA's DRA driver, a kube-scheduler with
        DRA, and GPU UUIDs in the portal's inventory) instead of counted device-plugin resources
        bound by the portal. Shares always use the counted resource.""",
    )
    dra_driver = Unicode(
        "gpu.nvidia.com", config=True, help="DRA driver whose device attributes claims select on."
    )
    dra_gpu_device_class = Unicode(
        "gpu.nvidia.com", config=True, help="DeviceClass of whole GPUs for DRA claims."
    )
    dra_mig_device_class = Unicode(
        "mig.nvidia.com", config=True, help="DeviceClass of MIG devices for DRA claims."
    )

    # Not a trait: the placement of the pod being started, for its claim.
    placed: PodPlacement | None = None

    @default("after_pod_created_hook")
    def _default_after_pod_created_hook(self) -> Any:
        return _after_pod_created

    def pod_settings(self) -> PodSettings:
        """The builders' settings from this spawner's traits (checked: a bad value raises
        ``InvalidRequest`` naming it)."""
        return PodSettings(
            isolation=IsolationSettings(
                namespace_prefix=self.tenant_namespace_prefix,
                label_prefix=self.portal_label_prefix,
                jobs_service_account=self.tenant_service_account,
                shared_gpu_resource=self.shared_gpu_resource,
                shared_gpu_replicas=self.shared_gpu_replicas,
                dra_gpu_device_class=self.dra_gpu_device_class,
                dra_mig_device_class=self.dra_mig_device_class,
            ),
            container=NOTEBOOK_CONTAINER,
            run_as_user=self.notebook_uid,
            run_as_group=self.notebook_gid,
            fs_group=self.notebook_gid,
            dra=(
                DraSettings(self.dra_driver, self.dra_gpu_device_class, self.dra_mig_device_class)
                if self.pin_devices_with_dra
                else None
            ),
        )

    async def load_user_options(self) -> None:
        # KubeSpawner runs this first in its start, before it starts its reflectors: the
        # namespace must be the tenant's by then.
        await super().load_user_options()
        if self.allocation is not None:
            try:
                self.namespace = self.pod_settings().isolation.namespace(self.allocation.tenant)
            except PortalError as exc:
                raise web.HTTPError(500, f"GPUKubeSpawner settings: {exc}") from exc
            self.dns_name = self.dns_name_template.format(
                namespace=self.namespace, name=self.pod_name
            )

    def get_env(self) -> dict[str, Any]:
        env: dict[str, Any] = super().get_env()
        if self.allocation is not None:
            env.update(allocation_env(self.allocation))
        return env

    async def get_pod_manifest(self) -> Any:
        """KubeSpawner's pod, placed on the allocation (``spawner.pod``)."""
        pod = await super().get_pod_manifest()
        allocation = self.allocation
        if allocation is None:
            return pod
        api = self.api.api_client
        data: dict[str, Any] = api.sanitize_for_serialization(pod)
        try:
            settings = self.pod_settings()
            self.placed = None
            if allocation.workload_id:
                placement = await self.placement(allocation)
                data = place_pod(data, placement, settings)
                if settings.uses_dra(placement):
                    resource_claim(placement, settings)  # refuses now, before the pod exists
                    self.placed = placement
            else:
                data = tenant_pod(data, allocation.tenant, settings)
        except PortalError as exc:
            # The operator's configuration (pod or traits) contradicts the allocation.
            raise web.HTTPError(500, f"cannot build the GPU pod: {exc}") from exc
        # KubeSpawner goes on with a model object (it reads pod.metadata.name).
        return api.deserialize(SimpleNamespace(data=json.dumps(data)), "V1Pod")

    async def placement(self, allocation: GPUAllocation) -> PodPlacement:
        """The pod's placement: the workload's allocation as the portal holds it now (its id is
        what the binder checks)."""
        async with self.portal() as portal:
            workload = await portal.status(allocation.workload_id)
        held = [a for a in workload.allocations if a.node == allocation.node]
        if not held:
            raise web.HTTPError(
                409,
                f"GPU workload {allocation.workload_id} no longer holds devices on node "
                f"{allocation.node} ({workload.state.value}); start the server again",
            )
        return PodPlacement.of(workload.tenant, workload.id, held[0])

    async def create_claim(self, pod: dict[str, Any]) -> None:
        """Create the ResourceClaim of the pod just created (when ``placed`` is set), owned by
        the pod so that the garbage collector deletes it with the pod. A claim that exists
        already (a retried start) is kept."""
        placement = self.placed
        if placement is None:
            return
        claim = resource_claim(placement, self.pod_settings())
        meta = pod["metadata"]
        claim["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": meta["name"],
                "uid": meta["uid"],
                # No blockOwnerDeletion: where OwnerReferencesPermissionEnforcement runs it
                # would need update on pods/finalizers, more than the hub's role grants.
                "controller": False,
            }
        ]
        custom = shared_client("CustomObjectsApi")
        try:
            await custom.create_namespaced_custom_object(
                "resource.k8s.io", "v1", claim["metadata"]["namespace"], "resourceclaims", claim
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
        self.log.info("Created ResourceClaim %s for %s", claim["metadata"]["name"], meta["name"])


async def _after_pod_created(spawner: GPUKubeSpawner, pod: dict[str, Any]) -> None:
    """KubeSpawner's ``after_pod_created_hook`` default; an operator's own hook must call
    ``spawner.create_claim(pod)`` when DRA pinning is on."""
    await spawner.create_claim(pod)
