"""The Kubernetes runner's copies of the cluster (``portal.kube.informer``): every Job (the
admission pass and the binder read them too), every Job's pods grouped by their Job, and the
nodes."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from portal.jobs.kube import manifests as m
from portal.kube.informer import Informer


@dataclass(frozen=True, slots=True)
class ClusterCopies:
    """The runner's copies of the cluster: every Job, every Job's pods (grouped by their Job)
    and the nodes."""

    jobs: Informer
    pods: Informer
    nodes: Informer

    @classmethod
    def start(cls, batch: client.BatchV1Api, core: client.CoreV1Api) -> ClusterCopies:
        started: list[Informer] = []
        try:
            for informer in (
                Informer(batch.list_job_for_all_namespaces, name="jobs"),
                Informer(
                    core.list_pod_for_all_namespaces,
                    name="job-pods",
                    index=job_of_pod,
                    label_selector=m.JOB_NAME_LABEL,
                ),
                Informer(core.list_node, name="nodes"),
            ):
                informer.start()
                started.append(informer)
        except BaseException:
            for informer in started:
                informer.stop()
            raise
        return cls(*started)

    def stop(self) -> None:
        for informer in (self.jobs, self.pods, self.nodes):
            informer.stop()


def job_of_pod(pod: Mapping[str, Any]) -> tuple[str, str] | None:
    meta = pod.get("metadata") or {}
    job = (meta.get("labels") or {}).get(m.JOB_NAME_LABEL)
    return (str(meta.get("namespace") or ""), str(job)) if job else None
