"""Active/standby replicas of ``gpuportal serve``, elected with a Kubernetes Lease.

Only the holder of the Lease (``coordination.k8s.io/v1``) is the portal: it opens the store as
the writer, starts the allocator (memory rebuilt from the database), runs the loops (binder,
reconcilers) and serves the API. A standby answers ``/health`` 200, ``/ready`` 503 (so the
Service sends it nothing) and every other request 503 ``unavailable`` with ``Retry-After``
and the leader's name (``portal.service.standby``); it polls the Lease meanwhile.

The election keeps to the rules of client-go's leader election:

- the leader renews every ``renew_s``; a standby takes the Lease once its record has not
  changed for ``duration_s`` *by the standby's own clock* (it times from when it saw the record
  change, never from the holder's ``renewTime``: the two clocks may differ);
- every write carries the Lease's ``resourceVersion``: of two standbys racing for an expired
  Lease one wins, the other is answered 409 and stays a standby;
- a leader that has not renewed for ``renew_deadline_s`` (shorter than the Lease) stops being
  the portal: the process exits 1 and the platform restarts it as a standby. Its memory is never
  trusted past its Lease, and it stops before any standby may take over;
- a leader that stops on SIGTERM gives the Lease up, so a standby takes over at its next poll
  rather than after a whole Lease.

The database's writer guard (``portal.store.guard``) stays underneath: even a leader that lost
its Lease without noticing cannot commit once another process holds the guard.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from kubernetes import client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as TransportError

if TYPE_CHECKING:
    from portal.settings import Settings

log = logging.getLogger(__name__)

UNREACHABLE = (ApiException, TransportError, OSError)
"""What a Lease call raises when the apiserver refuses or cannot be reached (urllib3's errors,
such as MaxRetryError, are not OSErrors)."""

SERVICE_ACCOUNT_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def default_identity() -> str:
    """The pod's name when the chart passes it (``POD_NAME``), else host and pid."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"


def default_namespace() -> str:
    """The namespace the pod runs in, else ``default``."""
    try:
        return SERVICE_ACCOUNT_NAMESPACE.read_text().strip() or "default"
    except OSError:
        return "default"


def _version(lease: client.V1Lease) -> str:
    return str(lease.metadata.resource_version) if lease.metadata is not None else ""


def _micro(at: datetime) -> str:
    # MicroTime wants exactly six fractional digits.
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass(frozen=True, slots=True)
class Seen:
    """The Lease record as last read, and when (monotonic) it was first seen so."""

    version: str
    holder: str
    at: float


class LeaseElector:
    """One candidate's view of the Lease ``namespace/name``; ``try_lead`` is one round."""

    def __init__(
        self,
        api: client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        duration_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not identity:
            raise ValueError("a candidate needs an identity")
        self._api = client.CoordinationV1Api(api)
        self.namespace = namespace
        self.name = name
        self.identity = identity
        self.duration_s = duration_s
        self._clock = clock
        self._seen: Seen | None = None

    @property
    def holder(self) -> str:
        """Who held the Lease when it was last read ('' when nobody)."""
        return self._seen.holder if self._seen is not None else ""

    def try_lead(self) -> bool:
        """Take or renew the Lease; True when this candidate holds it afterwards."""
        now = datetime.now(UTC)
        try:
            lease = self._api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as err:
            if err.status != 404:
                raise
            return self._create(now)
        spec = lease.spec
        holder = (spec.holder_identity if spec is not None else None) or ""
        version = _version(lease)
        if self._seen is None or self._seen.version != version:
            self._seen = Seen(version, holder, self._clock())
        if holder and holder != self.identity and self._clock() - self._seen.at < self.duration_s:
            return False  # another holds it and renewed within a Lease, as far as we saw
        ours = holder == self.identity
        transitions = (spec.lease_transitions or 0) if spec is not None else 0
        acquired = spec.acquire_time if ours and spec is not None else None
        body = self._body(
            now,
            version=version,
            acquire=_micro(acquired) if acquired is not None else _micro(now),
            transitions=transitions if ours else transitions + 1,
        )
        try:
            done = self._api.replace_namespaced_lease(self.name, self.namespace, cast(Any, body))
        except ApiException as err:
            if err.status == 409:  # changed since read: someone else renewed or took it
                return False
            raise
        if not ours:
            log.info("took the lease %s/%s from %r", self.namespace, self.name, holder or None)
        self._seen = Seen(_version(done), self.identity, self._clock())
        return True

    def release(self) -> None:
        """Give the Lease up if this candidate holds it (a clean stop): the next standby
        takes it at its next round. Best effort: an error leaves it to expire."""
        try:
            lease = self._api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec is None or lease.spec.holder_identity != self.identity:
                return
            body = self._body(
                datetime.now(UTC),
                version=_version(lease),
                acquire=None,
                transitions=lease.spec.lease_transitions or 0,
                holder="",
            )
            self._api.replace_namespaced_lease(self.name, self.namespace, cast(Any, body))
            log.info("gave up the lease %s/%s", self.namespace, self.name)
        except ApiException as err:
            log.warning("could not give up the lease %s/%s: %s", self.namespace, self.name, err)

    def _create(self, now: datetime) -> bool:
        body = self._body(now, version=None, acquire=_micro(now), transitions=0)
        try:
            done = self._api.create_namespaced_lease(self.namespace, cast(Any, body))
        except ApiException as err:
            if err.status == 409:  # another candidate created it first
                return False
            raise
        log.info("created the lease %s/%s", self.namespace, self.name)
        self._seen = Seen(_version(done), self.identity, self._clock())
        return True

    def _body(
        self,
        now: datetime,
        *,
        version: str | None,
        acquire: str | None,
        transitions: int,
        holder: str | None = None,
    ) -> dict[str, Any]:
        metadata: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if version is not None:
            metadata["resourceVersion"] = version
        spec: dict[str, Any] = {
            "holderIdentity": self.identity if holder is None else holder,
            "leaseDurationSeconds": max(1, round(self.duration_s)),
            "renewTime": _micro(now),
            "leaseTransitions": transitions,
        }
        if acquire is not None:
            spec["acquireTime"] = acquire
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": metadata,
            "spec": spec,
        }


class Leadership:
    """Runs an elector: ``wait_elected`` blocks until this process leads; afterwards a thread
    renews every ``renew_s`` and calls ``on_lost`` (once) when no renewal succeeded for
    ``renew_deadline_s``."""

    def __init__(
        self,
        elector: LeaseElector,
        *,
        renew_s: float,
        renew_deadline_s: float,
        on_lost: Callable[[str], None],
    ) -> None:
        if not 0 < renew_s < renew_deadline_s < elector.duration_s:
            raise ValueError(
                f"need 0 < renew ({renew_s}) < renew deadline ({renew_deadline_s}) < lease "
                f"duration ({elector.duration_s}) seconds"
            )
        self.elector = elector
        self._renew_s = renew_s
        self._deadline_s = renew_deadline_s
        self._on_lost = on_lost
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.lost: str | None = None

    def wait_elected(self, stopped: Callable[[], bool]) -> bool:
        """Poll until this process holds the Lease (True) or ``stopped()`` (False)."""
        while not stopped():
            try:
                if self.elector.try_lead():
                    self.start_renewing()
                    return True
            except UNREACHABLE as err:  # the apiserver is away: keep waiting
                log.warning("lease %s: %s", self.elector.name, err)
            self._stop.wait(self._renew_s)
        return False

    def start_renewing(self) -> None:
        self._thread = threading.Thread(target=self._renew, name="lease-renew", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self._renew_s):
            try:
                if self.elector.try_lead():
                    last = time.monotonic()
                    continue
                why = f"the lease was taken by {self.elector.holder!r}"
            except UNREACHABLE as err:
                why = f"the lease could not be renewed: {err}"
                if time.monotonic() - last < self._deadline_s:
                    log.warning("%s; retrying", why)
                    continue
            self.lost = why
            log.error("no longer the leader: %s", why)
            self._on_lost(why)
            return

    def stop(self, *, release: bool = True) -> None:
        """Stop renewing; give the Lease up unless it was lost."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if release and self.lost is None:
            self.elector.release()


RENEW_FRACTION = 0.2
"""The leader renews every fifth of the Lease..."""
DEADLINE_FRACTION = 0.7
"""...and stops being the portal when it has not renewed for seven tenths of it: before any
standby may take the Lease over."""


def lead_or_stand_by(
    settings: Settings,
    ip: str,
    port: int,
    prefix: str,
    stopped: Callable[[], bool],
    on_lost: Callable[[str], None],
    *,
    api_client: client.ApiClient | None = None,
) -> Leadership | None:
    """Serve as a standby on ``ip:port`` until this process holds the Lease; returns the
    leadership (renewing from then on), or None when ``stopped()`` first."""
    from portal.kube.service import cluster_client
    from portal.service.standby import StandbyServer, standby_app

    elector = LeaseElector(
        api_client or cluster_client(),
        settings.lease_namespace or default_namespace(),
        settings.lease_name,
        default_identity(),
        duration_s=settings.lease_duration_s,
    )
    leadership = Leadership(
        elector,
        renew_s=settings.lease_duration_s * RENEW_FRACTION,
        renew_deadline_s=settings.lease_duration_s * DEADLINE_FRACTION,
        on_lost=on_lost,
    )
    try:
        first = elector.try_lead()  # no standby phase when nobody else leads
    except UNREACHABLE as err:
        log.warning("lease %s: %s; standing by", elector.name, err)
        first = False
    if first:
        leadership.start_renewing()
        return leadership
    log.info(
        "standing by: the lease %s/%s is held by %r",
        elector.namespace,
        elector.name,
        elector.holder,
        extra={"fields": {"leader": elector.holder, "identity": elector.identity}},
    )
    standby = StandbyServer(standby_app(lambda: elector.holder, prefix), ip, port)
    standby.start()
    try:
        elected = leadership.wait_elected(stopped)
    finally:
        standby.stop()
    if not elected:
        return None
    log.info(
        "elected: this replica is the portal now", extra={"fields": {"identity": elector.identity}}
    )
    return leadership
