"""Who is calling: JupyterHub tokens, and the portal's custom scopes.

The portal trusts the hub: a token is whatever the hub says it is. ``HubAuthenticator`` asks
``GET {hub_api_url}/user`` (the token owner's model, with its expanded ``scopes`` and
``groups``) and caches the answer briefly. Tests use ``StaticAuthenticator``.

Scopes are JupyterHub custom scopes (they must start with ``custom:``). A scope may carry the
hub's group filter, ``custom:gpuportal:quotas:write!group=team-a``, which limits it to that
tenant; ``custom:gpuportal:admin`` grants every portal scope (for one tenant when filtered).
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Final, Protocol, runtime_checkable

import httpx

from policies.errors import Forbidden
from portal.errors import Unauthorized, Unavailable

PREFIX = "custom:gpuportal:"
GROUP_FILTER = "!group="


class Scope(StrEnum):
    """The portal's scopes; define them in the hub's ``c.JupyterHub.custom_scopes``."""

    QUOTAS_READ = PREFIX + "quotas:read"
    QUOTAS_WRITE = PREFIX + "quotas:write"
    QUEUE_READ = PREFIX + "queue:read"
    WORKLOADS_READ = PREFIX + "workloads:read"
    WORKLOADS_WRITE = PREFIX + "workloads:write"
    USAGE_READ = PREFIX + "usage:read"
    COST_READ = PREFIX + "cost:read"
    INVENTORY_READ = PREFIX + "inventory:read"
    METRICS_READ = PREFIX + "metrics:read"
    TELEMETRY_WRITE = PREFIX + "telemetry:write"
    SERVICES_CALL = PREFIX + "services:call"
    ADMIN = PREFIX + "admin"


SCOPE_HELP: dict[Scope, str] = {
    Scope.QUOTAS_READ: "read tenants and their quotas",
    Scope.QUOTAS_WRITE: "change quotas (and, unfiltered, tenants)",
    Scope.QUEUE_READ: "read the queue",
    Scope.WORKLOADS_READ: "read workloads and their allocations",
    Scope.WORKLOADS_WRITE: "request and release GPU workloads (members only)",
    Scope.USAGE_READ: "read quota usage, borrowing and lending",
    Scope.COST_READ: "read cost, chargeback and budgets",
    Scope.INVENTORY_READ: "read nodes, GPUs, MIG layouts, topology and capacity",
    Scope.METRICS_READ: "scrape the service's Prometheus metrics",
    Scope.TELEMETRY_WRITE: "send GPU samples (node agents, the Prometheus source)",
    Scope.SERVICES_CALL: "call inference services through the gateway (OpenAI API)",
    Scope.ADMIN: "every portal scope",
}


class CallerKind(StrEnum):
    USER = "user"
    SERVICE = "service"


@dataclass(frozen=True, slots=True)
class Caller:
    """A token's owner as the hub describes it. ``scopes`` are expanded hub scopes, filters
    included; ``groups`` are the user's groups (tenants); services have none."""

    name: str
    kind: CallerKind
    scopes: frozenset[str]
    groups: frozenset[str] = frozenset()

    def _holds(self, scope: Scope, tenant: str | None) -> bool:
        for held in (scope.value, Scope.ADMIN.value):
            if held in self.scopes:
                return True
            if tenant is not None and f"{held}{GROUP_FILTER}{tenant}" in self.scopes:
                return True
        return False

    def can(self, scope: Scope, tenant: str) -> bool:
        """True when the caller holds ``scope`` unfiltered, or filtered to ``tenant``'s group."""
        return self._holds(scope, tenant)

    def can_everywhere(self, scope: Scope) -> bool:
        """True when the caller holds ``scope`` (or admin) without a filter."""
        return self._holds(scope, None)

    def tenants_for(self, scope: Scope) -> frozenset[str]:
        """The tenants a filtered ``scope`` (or admin) names; see ``can_everywhere`` first."""
        out: set[str] = set()
        for held in self.scopes:
            base, sep, tenant = held.partition(GROUP_FILTER)
            if sep and base in (scope.value, Scope.ADMIN.value):
                out.add(tenant)
        return frozenset(out)

    def holds_any(self, scope: Scope) -> bool:
        """True when the caller holds ``scope`` in any form, for any tenant."""
        return self.can_everywhere(scope) or bool(self.tenants_for(scope))

    def require(self, scope: Scope, tenant: str) -> None:
        """Raise ``Forbidden`` unless the caller holds ``scope`` for ``tenant``."""
        if not self.can(scope, tenant):
            raise Forbidden(
                f"{self.kind} {self.name} may not use {scope} for tenant {tenant}: "
                f"needs {scope} or {scope}{GROUP_FILTER}{tenant}"
            )


class Authenticator(Protocol):
    """Turns a token into its owner. Returns None for a token nobody owns (unknown, expired,
    revoked). Must be thread-safe: the API calls it from its worker threads."""

    def __call__(self, token: str) -> Caller | None: ...


class Miss(StrEnum):
    """``RemembersTokens.remembered``'s answer when only asking (I/O) would tell."""

    MISS = "miss"


MISS: Final = Miss.MISS


@runtime_checkable
class RemembersTokens(Protocol):
    """An authenticator that can answer some tokens from memory, without I/O: the API then
    answers them on its event loop, and goes to a worker thread only on ``MISS`` (every
    request paying a thread hop costs more CPU than the lookup)."""

    def remembered(self, token: str) -> Caller | Miss | None: ...


def token_from_header(authorization: str | None) -> str:
    """The token of ``Authorization: token X`` or ``Bearer X``; raises ``Unauthorized``."""
    if not authorization:
        raise Unauthorized("no token: send 'Authorization: token <JupyterHub API token>'")
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() not in ("token", "bearer") or not token.strip():
        raise Unauthorized("malformed Authorization header: expected 'token <t>' or 'Bearer <t>'")
    return token.strip()


class StaticAuthenticator:
    """Tokens from a dict: for tests and single-user setups."""

    def __init__(self, tokens: Mapping[str, Caller]) -> None:
        self._tokens = dict(tokens)

    def __call__(self, token: str) -> Caller | None:
        return self._tokens.get(token)

    def remembered(self, token: str) -> Caller | None:
        return self._tokens.get(token)


def caller_from_hub_model(model: Mapping[str, object]) -> Caller:
    """A ``Caller`` from the hub's ``/user`` answer (a user or a service model)."""
    kind = CallerKind.SERVICE if model.get("kind") == "service" else CallerKind.USER
    scopes = model.get("scopes") or []
    groups = model.get("groups") or []
    return Caller(
        name=str(model.get("name", "")),
        kind=kind,
        scopes=frozenset(str(s) for s in _iterable(scopes)),
        groups=frozenset(str(g) for g in _iterable(groups)),
    )


def _iterable(value: object) -> Iterable[object]:
    return value if isinstance(value, list | tuple) else ()


class HubAuthenticator:
    """Asks the hub who owns a token; remembers answers (also "nobody") for ``ttl_s``.

    Args:
        hub_api_url: the hub's API, e.g. ``http://127.0.0.1:8081/hub/api``
            (``JUPYTERHUB_API_URL`` inside a hub service).
        ttl_s: how long an answer is reused; a revoked token keeps working at most this long.
        client: an ``httpx.Client`` to use (tests pass one with a transport).
    """

    def __init__(
        self,
        hub_api_url: str,
        *,
        ttl_s: float = 30.0,
        client: httpx.Client | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_entries: int = 10_000,
    ) -> None:
        self._url = hub_api_url.rstrip("/") + "/user"
        self._ttl = ttl_s
        self._client = client or httpx.Client(timeout=10.0)
        self._clock = clock
        self._max = max_entries
        self._cache: dict[str, tuple[float, Caller | None]] = {}
        self._lock = threading.Lock()

    def remembered(self, token: str) -> Caller | Miss | None:
        """The cached answer while fresh, else ``MISS`` (no I/O: the lock is never held
        while asking the hub)."""
        hit = self._hit(self._key(token), self._clock())
        return MISS if hit is None else hit[1]

    def __call__(self, token: str) -> Caller | None:
        key = self._key(token)
        now = self._clock()
        hit = self._hit(key, now)
        if hit is not None:
            return hit[1]
        caller = self._ask(token)
        with self._lock:
            if len(self._cache) >= self._max:
                self._cache = {k: v for k, v in self._cache.items() if v[0] > now}
                if len(self._cache) >= self._max:
                    self._cache.clear()
            self._cache[key] = (now + self._ttl, caller)
        return caller

    @staticmethod
    def _key(token: str) -> str:
        # Keep digests, not tokens, in memory.
        return hashlib.sha256(token.encode()).hexdigest()

    def _hit(self, key: str, now: float) -> tuple[float, Caller | None] | None:
        with self._lock:
            hit = self._cache.get(key)
        return hit if hit is not None and hit[0] > now else None

    def _ask(self, token: str) -> Caller | None:
        try:
            reply = self._client.get(self._url, headers={"Authorization": f"token {token}"})
            if reply.status_code in (401, 403, 404):
                return None
            reply.raise_for_status()
            model = reply.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise Unavailable(f"the hub at {self._url} did not answer ({exc}); retry") from exc
        if not isinstance(model, dict):
            return None
        return caller_from_hub_model(model)
