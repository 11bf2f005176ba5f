"""The weight cache on Kubernetes (objects: ``portal.inference.kubeweights``; decision 0015).

``KubeWeights.ensure`` is asked by the service controller each round a placed replica waits
for its weights: the first ask on a node makes the tenant's volume and claim there (once) and
the fetch Job; later asks read the Job. The replica is launched (its pod mounting the entry
read-only) only once the Job succeeded. A Job refused (the files do not match the digest, the
model is too large, the URI cannot be fetched) stays, so every later replica on that node is
refused with the same reason without fetching again; a Job whose source failed is deleted as
it is reported, so the next replica tries again (the controller's start-failure limit bounds
the tries). The cache keeps no state Kubernetes does not hold: its entries are the fetch Jobs
that succeeded, with their size (what the fetch pod verified, else what the model's source
declared when the Job was made) and their last use (an annotation written as a replica
starts on them).

Before a fetch, the tenant's entries on the node are counted against its cache size and the
least recently used ones no running replica uses are chosen to go (``policies.weightcache``,
the local cache's rule); an **evict Job** on the node removes each chosen folder
(``python -m portal.inference.fetch --evict``), its fetch Job is deleted once it succeeded,
and only then is the new fetch made. A model that cannot fit even so is refused with the
sizes that stand in the way: the replica ends with that reason, as on the local backend.
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

import httpx
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from policies.errors import InvalidRequest, Unavailable
from policies.isolation import IsolationSettings
from policies.services import ModelRef
from policies.weightcache import Held, make_room, no_room
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
HEAD_TIMEOUT_S = 10.0


class KubeWeights:
    """The cache over the cluster (see the module doc). Thread-safe.

    Needs: persistentvolumes get/create (cluster-wide); in the tenants' namespaces,
    persistentvolumeclaims get/create, jobs get/list/create/patch/delete and pods list.
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
        """The replica's weights on ``node``: ready once the fetch Job succeeded. Before a
        fetch, room is made in the tenant's cache on the node (``policies.weightcache``): the
        entries to evict are removed by evict Jobs, and the fetch starts once they are done.

        Raises:
            InvalidRequest: the fetch refused the model (see ``fetch.EXIT_REASONS``).
            Conflict: the tenant's cache on the node cannot make room for the model.
            Unavailable: the fetch failed, or the apiserver refused the cache's objects.
        """
        namespace = self._settings.namespace(tenant)
        name = kw.fetch_job_name(node, model.digest)
        key = (namespace, node, model.digest)
        self._ensure_claim(node, tenant)
        fetches, evictions = self._jobs(namespace, node)
        busy, failed = self._sweep(namespace, fetches, evictions)
        job = fetches.get(model.digest)
        if job is not None and job.state is kw.FetchState.FAILED:
            self._refuse(namespace, name, node, model, job.message)
        if job is None and failed:
            # The entry stays; this replica ends with why, the next one decides again.
            raise Unavailable(f"making room for {model.uri} on node {node}: {failed}")
        if model.digest in busy or (job is None and busy):
            # Being evicted, or evictions on the node not done yet: evict, then fetch.
            with self._lock:
                self._waited.add(key)
            return Fetched(Path(kw.MOUNT), 0, ready=False, waited=True)
        if job is None:
            size = declared_size(model.uri)
            held = self._held(namespace, fetches, in_use)
            room = make_room(held, size, self._config.tenant_bytes)
            if not room.fits:
                where = f"tenant {tenant} on node {node}"
                remedy = (
                    "stop a service of that tenant that uses another model there, or raise "
                    "GPUPORTAL_WEIGHT_CACHE_TENANT_BYTES"
                )
                raise no_room(where, size, room, self._config.tenant_bytes, remedy)
            if room.evict:
                for digest in room.evict:
                    self._create(namespace, kw.evict_job(node, tenant, digest, self._config,
                                                         self._settings))  # fmt: skip
            else:
                manifest = kw.fetch_job(node, tenant, model, self._config, self._settings, size)
                if self._create(namespace, manifest):
                    log.info("weights: fetch Job %s/%s for %s on %s", namespace, name,
                             model.uri, node)  # fmt: skip
        with self._lock:
            if job is None or job.state is kw.FetchState.RUNNING:
                self._waited.add(key)
                return Fetched(Path(kw.MOUNT), 0, ready=False, waited=True)
            # Replicas that waited ask again within a round or two of the fetch's end; one
            # asking later found the weights there.
            fresh = now - _time(job.finished_at) <= WAITED_S
            if not fresh:
                self._waited.discard(key)
            waited = fresh and key in self._waited
        self._touch(namespace, name, now)
        return Fetched(Path(kw.MOUNT), 0, waited=waited)

    def entries(self, in_use: InUse, tenants: Collection[str] | None = None) -> list[CacheEntry]:
        """One row per node, tenant and digest whose fetch Job succeeded: ``size`` is what
        the fetch pod verified, else what the source declared (0 if neither is known);
        ``last_used`` when a replica last started on it, else when it was fetched."""
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
        sizes = _reported_sizes(pods or [])
        used = set(in_use)
        rows = []
        for item in jobs or []:
            job = kw.fetch_job_view(item, self._settings)
            if job is None or job.state is not kw.FetchState.DONE:
                continue
            if tenants is not None and job.tenant not in tenants:
                continue
            size = sizes.get((job.namespace, job.name)) or job.declared
            held = (job.node, job.digest) in used
            rows.append(CacheEntry(job.node, job.tenant, job.digest, size, _last_used(job), held))
        return sorted(rows, key=lambda e: (e.node, e.tenant, e.digest))

    # -- helpers -------------------------------------------------------------------------------

    def _jobs(
        self, namespace: str, node: str
    ) -> tuple[dict[str, kw.FetchJob], dict[str, kw.FetchJob]]:
        """The tenant's fetch and evict Jobs on ``node``, by digest (one list call)."""
        components = f"{kw.FETCH_COMPONENT},{kw.EVICT_COMPONENT}"
        selector = f"{self._settings.label('component')} in ({components})"
        try:
            items = json_of(
                self._batch.list_namespaced_job(
                    namespace, label_selector=selector, _preload_content=False
                )
            ).get("items")
        except ApiException as e:
            raise Unavailable(f"cannot list the Jobs of {namespace}: {api_message(e)}") from e
        fetches: dict[str, kw.FetchJob] = {}
        evictions: dict[str, kw.FetchJob] = {}
        for item in items or []:
            for component, into in ((kw.FETCH_COMPONENT, fetches), (kw.EVICT_COMPONENT, evictions)):
                job = kw.fetch_job_view(item, self._settings, component)
                if job is not None and job.node == node:
                    into[job.digest] = job
        return fetches, evictions

    def _sweep(
        self, namespace: str, fetches: dict[str, kw.FetchJob], evictions: dict[str, kw.FetchJob]
    ) -> tuple[set[str], str]:
        """Finish the evictions on the node: once an evict Job succeeded its entry's fetch Job
        is deleted (the entry is gone), then the evict Job; one that failed is deleted so a
        later fetch decides again. The digests whose eviction was still there this round, and
        why one failed ("" if none did)."""
        failed = ""
        for digest, ev in evictions.items():
            if ev.state is kw.FetchState.RUNNING:
                continue
            if ev.state is kw.FetchState.DONE and digest in fetches:
                self._delete(namespace, fetches[digest].name)
            elif ev.state is kw.FetchState.FAILED:
                log.warning("weights: eviction %s/%s failed: %s", namespace, ev.name, ev.message)
                failed = f"the eviction of {digest} failed ({ev.message or 'no reason given'})"
            self._delete(namespace, ev.name)
        return set(evictions), failed

    def _held(self, namespace: str, fetches: dict[str, kw.FetchJob], in_use: InUse) -> list[Held]:
        """The tenant's entries on the node as the eviction rule counts them: done or still
        being fetched (never evicted, counted at their declared size)."""
        try:
            pods = json_of(
                self._core.list_namespaced_pod(
                    namespace,
                    label_selector=f"{self._settings.label('component')}={kw.FETCH_COMPONENT}",
                    _preload_content=False,
                )
            ).get("items")
        except ApiException as e:
            raise Unavailable(f"cannot list the fetch pods of {namespace}: {api_message(e)}") from e
        sizes = _reported_sizes(pods or [])
        used = set(in_use)
        return [
            Held(
                job.digest,
                sizes.get((namespace, job.name)) or job.declared,
                _last_used(job),
                job.state is not kw.FetchState.DONE or (job.node, job.digest) in used,
            )
            for job in fetches.values()
            if job.state is not kw.FetchState.FAILED and not job.deleting
        ]

    def _create(self, namespace: str, manifest: dict[str, Any]) -> bool:
        """Create a cache Job; False if it was there already (409: made meanwhile)."""
        name = manifest["metadata"]["name"]
        try:
            drain(
                self._batch.create_namespaced_job(
                    namespace, cast(Any, manifest), _preload_content=False
                )
            )
        except ApiException as e:
            if e.status == 409:
                return False
            raise Unavailable(f"cannot create Job {namespace}/{name}: {api_message(e)}") from e
        return True

    def _delete(self, namespace: str, name: str) -> None:
        try:
            drain(
                self._batch.delete_namespaced_job(
                    name, namespace, propagation_policy="Background", _preload_content=False
                )
            )
        except ApiException as e:
            if e.status != 404:
                log.warning("weights: cannot delete Job %s/%s: %s", namespace, name, e)

    def _touch(self, namespace: str, name: str, now: datetime) -> None:
        """Record on the entry's fetch Job that a replica starts on it now (its last use)."""
        patch = {"metadata": {"annotations": {self._settings.label(kw.LAST_USED): now.isoformat()}}}
        try:
            drain(self._batch.patch_namespaced_job(name, namespace, patch, _preload_content=False))
        except ApiException as e:
            # Only the order of later evictions depends on it: the replica still starts.
            log.warning("weights: cannot record the use of %s/%s: %s", namespace, name, e)

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
            self._delete(namespace, name)
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


def declared_size(uri: str) -> int:
    """The size the model's source declares (its Content-Length), 0 if it declares none or
    does not answer: the entry is then counted from what its fetch pod reports."""
    try:
        r = httpx.head(uri, timeout=HEAD_TIMEOUT_S, follow_redirects=True)
    except httpx.HTTPError as exc:
        log.info("weights: no declared size for %s: %s", uri, exc)
        return 0
    length = r.headers.get("content-length", "")
    return int(length) if r.status_code == 200 and length.isdigit() else 0


def _last_used(job: kw.FetchJob) -> datetime:
    """When a replica last started on the entry, else when it was fetched (a Job still
    running: the epoch; it is not evicted anyway)."""
    return max(_time(job.finished_at), _time(job.last_used))


def _reported_sizes(pods: list[dict[str, Any]]) -> dict[tuple[str, str], int]:
    """(namespace, Job name) -> the size its succeeded pod reported, where one did."""
    out = {}
    for p in pods:
        size = _reported_size(p)
        if size:
            out[(str((p.get("metadata") or {}).get("namespace")), _job_of(p))] = size
    return out


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
    if not stamp:
        return datetime.fromtimestamp(0, UTC)
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    except ValueError:
        return datetime.fromtimestamp(0, UTC)
