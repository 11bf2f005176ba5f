"""The weight cache on Kubernetes (objects: ``portal.inference.kubeweights``; decision 0015).

``KubeWeights.ensure`` is asked by the service controller each round a placed replica waits
for its weights: the first ask on a node makes the tenant's volume and claim there (once) and
the fetch Job; later asks read the Job. The replica is launched (its pod mounting the entry
read-only) only once the Job succeeded. A Job refused (the files do not match the digest, the
model is too large, the URI cannot be fetched) stays, so every later replica on that node is
refused with the same reason without fetching again; a Job whose source failed is deleted as
it is reported, so the next replica tries again (the controller's start-failure limit bounds
the tries). The cache keeps no state Kubernetes does not hold: its entries are the fetch Jobs
that succeeded.

Not built yet: per-tenant size accounting and least-recently-used eviction (a fetch refuses
only a model larger than a tenant's share of a node).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.errors import InvalidRequest, Unavailable
from policies.isolation import IsolationSettings
from policies.services import ModelRef
from portal.inference import fetch
from portal.inference import kubeweights as kw
from portal.inference.weights import CacheEntry, Fetched, InUse
from portal.jobs.kube.pods import api_message, json_of
from portal.kube.calls import drain

log = logging.getLogger(__name__)

FETCHED_BY_PODS = ("http", "https")
"""What a fetch pod fetches (a ``file://`` path is not on the nodes; an ``hf://`` model is
fetched by its engine)."""
JOB_NAME_LABEL = "job-name"
WAITED_S = timedelta(seconds=60)
"""How long after its fetch ended a replica that asked during the fetch is told it waited
(a cold start) rather than found the weights there."""


class KubeWeights:
    """The cache over the cluster (see the module doc). Thread-safe.

    Needs: persistentvolumes get/create (cluster-wide); in the tenants' namespaces,
    persistentvolumeclaims get/create, jobs get/list/create/delete and pods list.
    """

    per_tenant = True

    def __init__(
        self, api_client: client.ApiClient, settings: IsolationSettings, config: kw.CacheConfig
    ) -> None:
        self._core = client.CoreV1Api(api_client)
        self._batch = client.BatchV1Api(api_client)
        self._settings = settings
        self._config = config
        self._lock = threading.Lock()
        self._claims: set[tuple[str, str]] = set()  # (namespace, node) made or seen
        self._waited: set[tuple[str, str, str]] = set()  # (namespace, node, digest)

    def caches(self, uri: str) -> bool:
        return urlsplit(uri).scheme in FETCHED_BY_PODS

    def ensure(
        self, node: str, tenant: str, model: ModelRef, in_use: InUse, now: datetime
    ) -> Fetched:
        """The replica's weights on ``node``: ready once the fetch Job succeeded.

        Raises:
            InvalidRequest: the fetch refused the model (see ``fetch.EXIT_REASONS``).
            Unavailable: the fetch failed, or the apiserver refused the cache's objects.
        """
        namespace = self._settings.namespace(tenant)
        name = kw.fetch_job_name(node, model.digest)
        key = (namespace, node, model.digest)
        self._ensure_claim(node, tenant)
        job = self._read_job(namespace, name)
        if job is not None and job.state is kw.FetchState.FAILED:
            self._refuse(namespace, name, node, model, job.message)
        if job is None:
            manifest = kw.fetch_job(node, tenant, model, self._config, self._settings)
            try:
                drain(
                    self._batch.create_namespaced_job(
                        namespace, cast(Any, manifest), _preload_content=False
                    )
                )
                log.info("weights: fetch Job %s/%s for %s on %s", namespace, name, model.uri, node)
            except ApiException as e:
                if e.status != 409:  # made meanwhile: the same fetch
                    raise Unavailable(
                        f"cannot create Job {namespace}/{name}: {api_message(e)}"
                    ) from e
        with self._lock:
            if job is None or job.state is kw.FetchState.RUNNING:
                self._waited.add(key)
                return Fetched(Path(kw.MOUNT), 0, ready=False, waited=True)
            # Replicas that waited ask again within a round or two of the fetch's end; one
            # asking later found the weights there.
            fresh = now - _time(job.finished_at) <= WAITED_S
            if not fresh:
                self._waited.discard(key)
            return Fetched(Path(kw.MOUNT), 0, waited=fresh and key in self._waited)

    def entries(self, in_use: InUse, tenants: Collection[str] | None = None) -> list[CacheEntry]:
        """One row per node, tenant and digest whose fetch Job succeeded; ``size`` is what
        the fetch pod reported (0 if it reported nothing)."""
        selector = f"{self._settings.label('component')}={kw.FETCH_COMPONENT}"
        try:
            jobs = json_of(
                self._batch.list_job_for_all_namespaces(
                    label_selector=selector, _preload_content=False
                )
            ).get("items")
            pods = json_of(
                self._core.list_pod_for_all_namespaces(
                    label_selector=selector, _preload_content=False
                )
            ).get("items")
        except ApiException as e:
            raise Unavailable(f"cannot list the weight fetch Jobs: {api_message(e)}") from e
        sizes = {
            (str((p.get("metadata") or {}).get("namespace")), _job_of(p)): _reported_size(p)
            for p in pods or []
        }
        used = set(in_use)
        rows = []
        for item in jobs or []:
            job = kw.fetch_job_view(item, self._settings)
            if job is None or job.state is not kw.FetchState.DONE:
                continue
            if tenants is not None and job.tenant not in tenants:
                continue
            name = str((item.get("metadata") or {}).get("name"))
            at = _time(job.finished_at)
            size = sizes.get((job.namespace, name), 0)
            held = (job.node, job.digest) in used
            rows.append(CacheEntry(job.node, job.tenant, job.digest, size, at, held))
        return sorted(rows, key=lambda e: (e.node, e.tenant, e.digest))

    # -- helpers -------------------------------------------------------------------------------

    def _read_job(self, namespace: str, name: str) -> kw.FetchJob | None:
        try:
            item = json_of(self._batch.read_namespaced_job(name, namespace, _preload_content=False))
        except ApiException as e:
            if e.status == 404:
                return None
            raise Unavailable(f"cannot read Job {namespace}/{name}: {api_message(e)}") from e
        return kw.fetch_job_view(item, self._settings)

    def _refuse(
        self, namespace: str, name: str, node: str, model: ModelRef, job_message: str
    ) -> None:
        """Raise why the Job failed; a source that failed is tried again by the next replica."""
        code, message = self._failure(namespace, name)
        reason = kw.failure_reason(code, message if code is not None else job_message)
        if code in (fetch.MISMATCH, fetch.USAGE):
            field = "model.digest" if code == fetch.MISMATCH else "model.uri"
            value = model.digest if code == fetch.MISMATCH else model.uri
            raise InvalidRequest(
                field, value, f"a model its fetch on node {node} accepts ({reason})"
            )
        if code != fetch.TOO_LARGE:
            try:
                drain(
                    self._batch.delete_namespaced_job(
                        name, namespace, propagation_policy="Background", _preload_content=False
                    )
                )
            except ApiException as e:
                if e.status != 404:
                    log.warning("weights: cannot delete Job %s/%s: %s", namespace, name, e)
        raise Unavailable(f"fetching {model.uri} on node {node}: {reason}")

    def _failure(self, namespace: str, name: str) -> tuple[int | None, str]:
        """The exit code and termination message of the Job's last failed pod."""
        try:
            pods = json_of(
                self._core.list_namespaced_pod(
                    namespace, label_selector=f"{JOB_NAME_LABEL}={name}", _preload_content=False
                )
            ).get("items")
        except ApiException as e:
            return None, f"its pods cannot be read: {api_message(e)}"
        for pod in reversed(pods or []):
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                done = (cs.get("state") or {}).get("terminated") or {}
                if done.get("exitCode"):
                    return int(done["exitCode"]), str(done.get("message") or "")
        return None, ""

    def _ensure_claim(self, node: str, tenant: str) -> None:
        """The tenant's volume on ``node`` and its claim, created unless already there."""
        namespace = self._settings.namespace(tenant)
        with self._lock:
            if (namespace, node) in self._claims:
                return
        volume = kw.cache_volume(node, tenant, self._config, self._settings)
        claim = kw.cache_claim(node, tenant, self._config, self._settings)
        try:
            self._core.create_persistent_volume(cast(Any, volume), _preload_content=False)
        except ApiException as e:
            if e.status != 409:
                name = volume["metadata"]["name"]
                raise Unavailable(f"cannot create PersistentVolume {name}: {api_message(e)}") from e
        try:
            self._core.create_namespaced_persistent_volume_claim(
                namespace, cast(Any, claim), _preload_content=False
            )
        except ApiException as e:
            if e.status != 409:
                name = claim["metadata"]["name"]
                raise Unavailable(
                    f"cannot create claim {namespace}/{name}: {api_message(e)}"
                ) from e
        with self._lock:
            self._claims.add((namespace, node))


def _job_of(pod: dict[str, Any]) -> str:
    return str(((pod.get("metadata") or {}).get("labels") or {}).get(JOB_NAME_LABEL) or "")


def _reported_size(pod: dict[str, Any]) -> int:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        done = (cs.get("state") or {}).get("terminated") or {}
        if done.get("exitCode") == 0:
            try:
                return int(json.loads(done.get("message") or "{}").get("size", 0))
            except (ValueError, AttributeError):
                return 0
    return 0


def _time(stamp: str) -> datetime:
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return datetime.fromtimestamp(0, UTC)
