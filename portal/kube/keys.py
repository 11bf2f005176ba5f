"""The contract between GPU pods and the portal on Kubernetes: the scheduler name the portal
answers to, and the label and annotation keys a GPU pod carries.

The spawner writes them (``spawner.pod``), the binder and the sweep read them
(``portal.kube.binder``); both derive the keys from the same ``IsolationSettings.label_prefix``
as the tenant objects, so one prefix names everything the portal owns.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.isolation import IsolationSettings

SCHEDULER_NAME = "gpuportal"
"""``spec.schedulerName`` of pods the portal places: the default scheduler leaves them alone and
the binder binds them to the node the allocator chose."""

EVENT_SOURCE = "gpuportal-binder"
"""``source.component`` of the Events the binder posts on pods it cannot bind."""


@dataclass(frozen=True, slots=True)
class PodKeys:
    """Label and annotation keys of GPU pods.

    Labels (selectable): ``tenant``, ``workload`` (the allocator's workload id) and
    ``allocation`` (the allocation the pod uses). Annotations (informational, for people and
    tools): the chosen ``node``, the ``flavor``, the GPU indices ``gpus`` and ``gpu-uuids``.
    The binder trusts only the ``allocation`` and ``workload`` values, and checks them against
    the allocator.
    """

    tenant: str
    workload: str
    allocation: str
    node: str
    flavor: str
    gpus: str
    gpu_uuids: str

    @staticmethod
    def of(settings: IsolationSettings) -> PodKeys:
        return PodKeys(
            tenant=settings.label("tenant"),
            workload=settings.label("workload"),
            allocation=settings.label("allocation"),
            node=settings.label("node"),
            flavor=settings.label("flavor"),
            gpus=settings.label("gpus"),
            gpu_uuids=settings.label("gpu-uuids"),
        )

    def selector(self) -> str:
        """Label selector of every GPU pod the portal placed (any tenant)."""
        return f"{self.workload},{self.allocation}"
