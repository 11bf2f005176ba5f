"""Release notebook workloads whose server the hub no longer runs (reason ``server-gone``).

A spawner releases its server's devices when the server stops (``spawner.mixin``). When that
release cannot reach the portal (the portal was down, or stopped before the servers), the
devices would stay allocated, block the tenant's queue and keep being charged. So the service,
when it runs as a hub service (``JUPYTERHUB_API_URL`` and ``JUPYTERHUB_API_TOKEN`` set), asks
the hub which servers exist — at start and every ``GPUPORTAL_HUB_RECONCILE_INTERVAL_S`` — and
releases, through the allocator, every notebook workload of a spawner whose server is gone.

Which workloads: kind ``notebook``, named the way the spawner names them (``<owner>/<server>``,
``<owner>/default`` for the default server), holding devices for at least ``min_age_s``
(``GPUPORTAL_HUB_RECONCILE_MIN_AGE_S``, 30 s), so a spawn in flight is not judged. Other notebook
workloads (requested through the API under another name) have no server to check and
are left alone. Queued ones hold nothing and are left alone too: a spawn that died with the hub
finds its queue place again when the user spawns again (``spawner.mixin``); should such a
workload be allocated with no server to take it, a later round releases it. A server counts as
present while the hub lists it, pending spawns included. When the hub cannot be read, nothing
is released.

The order is deliberate: the workloads are read first and the hub second, so a workload whose
spawn began after the hub answered cannot be taken for a gone one.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import httpx

from policies.errors import NotFound
from policies.requests import WorkloadKind
from portal.allocator import Allocator, WorkloadStatus
from portal.service.loops import Loops

log = logging.getLogger(__name__)

SERVER_GONE = "server-gone"
LOOP_NAME = "hub-servers"
_PAGE = 200  # JupyterHub's default page size of GET /users

Servers = set[tuple[str, str]]
"""(user, server name) of every server the hub runs or is starting; "" is the default one."""


class HubServers:
    """The servers the hub lists (``GET /hub/api/users?state=active``).

    The token needs ``list:users`` and ``read:servers`` (the portal service's role has them,
    ``portal.hubroles.SERVICE_HUB_SCOPES``).
    """

    def __init__(self, hub_api_url: str, token: str, client: httpx.Client | None = None) -> None:
        self._url = hub_api_url.rstrip("/")
        self._client = client or httpx.Client(
            timeout=10.0, headers={"Authorization": f"token {token}"}
        )

    def __call__(self) -> Servers:
        """Every active server; raises ``httpx.HTTPError`` when the hub does not answer fully."""
        found: Servers = set()
        for user in self._users():
            servers = user.get("servers")
            for name in servers if isinstance(servers, Mapping) else ():
                found.add((str(user["name"]), str(name)))
        return found

    def _users(self) -> Iterator[Mapping[str, object]]:
        offset = 0
        while True:
            query = urlencode({"state": "active", "offset": offset, "limit": _PAGE})
            response = self._client.get(f"{self._url}/users?{query}")
            response.raise_for_status()
            page = response.json()
            if not isinstance(page, list):
                raise httpx.DecodingError(f"GET /users answered {type(page).__name__}, not a list")
            yield from page
            if len(page) < _PAGE:
                return
            offset += len(page)

    def close(self) -> None:
        self._client.close()


def server_of(w: WorkloadStatus) -> str | None:
    """The hub server name of a spawner's notebook workload ("" for the default server), or
    None when the workload was not named by a spawner."""
    user, sep, server = w.name.partition("/")
    if not sep or user != w.owner or not server:
        return None
    return "" if server == "default" else server


def release_gone(
    allocator: Allocator,
    servers: Callable[[], Servers],
    *,
    min_age_s: float = 30.0,
    now: Callable[[], datetime] = lambda: datetime.now(UTC),
) -> list[str]:
    """One round: release the spawners' notebook workloads whose server is gone; returns
    their ids. Raises what ``servers`` raises (nothing is released then)."""
    oldest = now() - timedelta(seconds=min_age_s)
    candidates = [
        (w, server)
        for w in allocator.workloads()
        if w.kind == WorkloadKind.NOTEBOOK
        and w.started_at is not None
        and w.started_at <= oldest
        and (server := server_of(w)) is not None
    ]
    if not candidates:
        return []
    running = servers()
    released = []
    for w, server in candidates:
        if (w.owner, server) in running:
            continue
        try:
            allocator.release(w.id, reason=SERVER_GONE)
        except NotFound:
            continue  # ended meanwhile
        shown = server or "default"
        log.warning(
            "released %s of %s (%s): the hub no longer runs %s's server %r",
            w.id,
            w.tenant,
            w.name,
            w.owner,
            shown,
            extra={"fields": {"workload": w.id, "tenant": w.tenant, "reason": SERVER_GONE}},
        )
        released.append(w.id)
    return released


def register_for_service(
    loops: Loops,
    allocator: Allocator,
    interval_s: float,
    environ: Mapping[str, str],
    *,
    min_age_s: float,
) -> bool:
    """Add the ``hub-servers`` loop (first round at once) when the service runs under a hub;
    returns whether it did."""
    hub, token = environ.get("JUPYTERHUB_API_URL"), environ.get("JUPYTERHUB_API_TOKEN")
    if not hub or not token:
        return False
    servers = HubServers(hub, token)
    loops.add(LOOP_NAME, interval_s, lambda: _round(allocator, servers, min_age_s), first_after_s=0)
    log.info("releasing notebook GPUs of servers the hub no longer runs, every %.0f s", interval_s)
    return True


def _round(allocator: Allocator, servers: HubServers, min_age_s: float) -> None:
    try:
        release_gone(allocator, servers, min_age_s=min_age_s)
    except httpx.HTTPError as exc:
        # The hub may still be starting (it starts its services first), or restarting.
        log.info("hub servers not read (%s); nothing released this round", exc)
