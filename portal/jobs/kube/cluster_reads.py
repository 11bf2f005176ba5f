"""What the Kubernetes job runner reads back from the API: an attempt's Job, its members' pods
by rank, the nodes they run on, and the members' logs (the kubelet serves them).

``ClusterReads`` is the base of ``portal.jobs.kube.runner.KubeRunner``, which owns the API
clients declared here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from portal.jobs.backend import LogChunk
from portal.jobs.kube import manifests as m
from portal.jobs.kube import pods as kpods
from portal.jobs.runner import RunnerError


@dataclass(slots=True)
class WatchedAttempt:
    """An attempt the runner watches: its Job, and the ranks it has reported."""

    job_id: str
    attempt: int
    namespace: str
    name: str
    members: int
    uid: str = ""
    external: bool = False
    stopping: bool = False
    reported: set[int] = field(default_factory=set)
    # A kubectl Job runs every attempt: its pods belong to the attempt whose time they were
    # created in (seconds since the epoch; pods of a resumed Job are created after the resume).
    not_before: float = 0.0
    not_after: float | None = None


class ClusterReads:
    """Reads of a ``KubeRunner``: Jobs, pods, nodes and logs, straight from the API."""

    _core: client.CoreV1Api
    _batch: client.BatchV1Api
    _keys: m.JobKeys
    _clock: Callable[[], float]

    def log_path(self, job_id: str, attempt: int, rank: int) -> Path:
        """Members' logs are not files on this host: see ``read_log``. The path names the
        member for people and never exists."""
        return Path("kubernetes") / job_id / f"attempt-{attempt}" / f"rank-{rank}"

    def read_log(self, job_id: str, attempt: int, rank: int, offset: int, limit: int) -> LogChunk:
        """The member pod's log through the API (the kubelet serves it)."""
        selector = f"{self._keys.job}={job_id},{self._keys.attempt}={attempt}"
        try:
            jobs = (
                kpods.json_of(
                    self._batch.list_job_for_all_namespaces(
                        label_selector=selector, _preload_content=False
                    )
                ).get("items")
                or []
            )
            if not jobs:
                return LogChunk(b"", 0, f"attempt {attempt} has no Job any more: its log is gone")
            meta = jobs[0]["metadata"]
            pods = (
                kpods.json_of(
                    self._core.list_namespaced_pod(
                        meta["namespace"],
                        label_selector=f"{m.JOB_NAME_LABEL}={meta['name']},{m.COMPLETION_INDEX}={rank}",
                        _preload_content=False,
                    )
                ).get("items")
                or []
            )
            if not pods:
                return LogChunk(b"", 0, f"rank {rank} has no pod (yet): no log to read")
            pod = max(pods, key=lambda p: p["metadata"].get("creationTimestamp") or "")
            name = pod["metadata"]["name"]
            container = m.CONTAINER if kpods.has_member(pod) else None
            return kpods.pod_log(self._core, name, meta["namespace"], container, offset, limit)
        except ApiException as e:
            where = f"pod of rank {rank}"
            return LogChunk(
                b"", 0, f"the log of the {where} cannot be read: {kpods.api_message(e)}"
            )

    def _read_job(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            return kpods.json_of(
                self._batch.read_namespaced_job(name, namespace, _preload_content=False)
            )
        except ApiException as e:
            if e.status == 404:
                return None
            raise RunnerError(f"cannot read Job {namespace}/{name}: {kpods.api_message(e)}") from e

    def _portal_jobs(self) -> list[dict[str, Any]]:
        items = kpods.json_of(
            self._batch.list_job_for_all_namespaces(
                label_selector=self._keys.job, _preload_content=False
            )
        ).get("items")
        return list(items or [])

    def _ranks(
        self, t: WatchedAttempt, pods: Iterable[Mapping[str, Any]]
    ) -> dict[int, list[Mapping[str, Any]]]:
        by_rank: dict[int, list[Mapping[str, Any]]] = {}
        for pod in self._pods_of(t, pods):
            index = kpods.index(pod)
            if index is not None:
                by_rank.setdefault(index, []).append(pod)
        return by_rank

    def _list_pods(self, t: WatchedAttempt) -> list[dict[str, Any]]:
        selector = f"{m.JOB_NAME_LABEL}={t.name}"
        items = kpods.json_of(
            self._core.list_namespaced_pod(
                t.namespace, label_selector=selector, _preload_content=False
            )
        ).get("items")
        return list(items or [])

    @staticmethod
    def _pods_of(t: WatchedAttempt, pods: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        out = []
        for p in pods:
            meta = p.get("metadata") or {}
            labels = meta.get("labels") or {}
            if meta.get("namespace") != t.namespace or labels.get(m.JOB_NAME_LABEL) != t.name:
                continue
            if t.uid and labels.get(m.JOB_UID_LABEL, t.uid) != t.uid:
                continue
            if t.external:
                created = kpods.epoch(meta.get("creationTimestamp"), 0.0)
                if created < t.not_before - 1 or (
                    t.not_after is not None and created > t.not_after + 1
                ):
                    continue  # another attempt's pod (a second of clock skew allowed)
            out.append(p)
        return out

    def _nodes(self, items: Iterable[Mapping[str, Any]]) -> dict[str, kpods.NodeState]:
        now = self._clock()
        return {n["metadata"]["name"]: kpods.node_state(n, now) for n in items}

    def _node(self, name: str, now: float) -> kpods.NodeState | None:
        """A node the informer does not know (added a moment ago, or deleted), read."""
        try:
            node = kpods.json_of(self._core.read_node(name, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise RunnerError(f"cannot read node {name}: {kpods.api_message(e)}") from e
        return kpods.node_state(node, now)
