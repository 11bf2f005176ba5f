"""What every route depends on: the allocator, the caller with a declared scope, paging.

Each route names exactly one scope through ``requires(scope)``; the auth-coverage test walks
the route table and fails on a route without one (see ``route_scope``).
"""

from __future__ import annotations

from collections.abc import Callable, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Query, Request, Security
from fastapi.security import APIKeyHeader
from starlette.concurrency import run_in_threadpool

from policies.errors import Conflict, Forbidden, InvalidRequest, NotFound
from portal.allocator import Allocator
from portal.api.auth import MISS, Authenticator, Caller, RemembersTokens, Scope, token_from_header
from portal.api.schemas import MAX_PAGE, Page
from portal.errors import PreconditionFailed, PreconditionRequired, Unauthorized

T = TypeVar("T")
S = TypeVar("S")

_token_header = APIKeyHeader(
    scheme_name="JupyterHubToken",
    name="Authorization",
    auto_error=False,
    description="A JupyterHub API token: `token <t>` or `Bearer <t>`.",
)


def allocator(request: Request) -> Allocator:
    alloc: Allocator = request.app.state.allocator
    return alloc


async def _authenticator(request: Request) -> Authenticator:
    # async: no I/O here, so no hop to the thread pool (a sync dependency costs one per call)
    auth: Authenticator = request.app.state.authenticator
    return auth


@dataclass(frozen=True, slots=True)
class Requires:
    """Dependency: the caller, who must hold ``scope`` for at least one tenant.

    Routes that act on one tenant check it again with ``caller.require(scope, tenant)``.
    """

    scope: Scope

    async def __call__(
        self,
        request: Request,
        authorization: Annotated[str | None, Security(_token_header)],
        authenticator: Annotated[Authenticator, Depends(_authenticator)],
    ) -> Caller:
        return await caller_holding(self.scope, authorization, authenticator, request.scope)


async def caller_holding(
    scope: Scope,
    authorization: str | None,
    authenticator: Authenticator,
    asgi_scope: MutableMapping[str, Any],
) -> Caller:
    """The owner of the ``Authorization`` header's token, who must hold ``scope`` for at least
    one tenant; noted in the request's state for its access line. Raises ``Unauthorized`` or
    ``Forbidden``. ``Requires`` and the gateway's own path (``portal.inference.gateway_asgi``)
    both check callers with it."""
    caller = await authenticate(authenticator, token_from_header(authorization))
    asgi_scope.setdefault("state", {})["caller"] = caller  # for the request log line
    if caller is None:
        raise Unauthorized("unknown or expired token: get a new one from the hub")
    if not caller.holds_any(scope):
        raise Forbidden(f"{caller.kind} {caller.name} lacks scope {scope}")
    return caller


async def authenticate(authenticator: Authenticator, token: str) -> Caller | None:
    """The token's owner: from the authenticator's memory on the event loop when it has the
    answer, else in a worker thread (asking the hub blocks)."""
    if isinstance(authenticator, RemembersTokens):
        known = authenticator.remembered(token)
        if known is not MISS:
            return known
    return await run_in_threadpool(authenticator, token)


def requires(scope: Scope) -> Caller:
    """``caller: Annotated[Caller, requires(Scope.X)]`` in a route's signature.

    The scope also lands in the route's OpenAPI ``security`` requirement, where clients, the
    docs and the auth-coverage test read it.
    """
    dep: Caller = Security(Requires(scope), scopes=[scope.value])
    return dep


@dataclass(frozen=True, slots=True)
class Paging:
    limit: int
    offset: int

    def page(self, items: Sequence[T]) -> Page[T]:
        chunk = list(items[self.offset : self.offset + self.limit])
        end = self.offset + len(chunk)
        return Page[T](
            items=chunk,
            total=len(items),
            limit=self.limit,
            offset=self.offset,
            next_offset=end if end < len(items) else None,
        )

    def page_of(self, items: Sequence[S], convert: Callable[[S], T]) -> Page[T]:
        """Like ``page``, converting only this page's items: for lists whose answers are
        costly to build (one page of ``/nodes`` instead of every node per request)."""
        chunk = self.page(items)
        return Page[T](
            items=[convert(item) for item in chunk.items],
            total=chunk.total,
            limit=chunk.limit,
            offset=chunk.offset,
            next_offset=chunk.next_offset,
        )


def paging(
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description=f"Page size, 1..{MAX_PAGE}.")] = 100,
    offset: Annotated[int, Query(ge=0, le=10_000_000, description="Items to skip.")] = 0,
) -> Paging:
    return Paging(limit, offset)


def visible_tenants(caller: Caller, scope: Scope, tenant: str | None) -> frozenset[str] | None:
    """Which tenants a list may show: None for all; raises ``Forbidden`` for a named tenant the
    caller may not see."""
    if tenant is not None:
        caller.require(scope, tenant)
        return frozenset({tenant})
    if caller.can_everywhere(scope):
        return None
    return caller.tenants_for(scope)


def listed_tenants(
    caller: Caller, scope: Scope, tenant: str | None, alloc: Allocator
) -> frozenset[str] | None:
    """``visible_tenants`` for lists of what tenants have now (quotas, usage, queue,
    workloads, alerts): a named tenant that does not exist is a 404, like reading it. The
    scope is checked first, so a caller learns nothing of tenants it may not see. (Cost
    lists take tenants deleted since: their history still costs.)"""
    shown = visible_tenants(caller, scope, tenant)
    if tenant is not None and tenant not in {t.name for t in alloc.tenants()}:
        raise NotFound("tenant", tenant)
    return shown


def etag(version: int) -> str:
    """The strong ETag of a versioned resource."""
    return f'"{version}"'


def expected_version(if_match: str | None, if_none_match: str | None) -> int:
    """The version an edit expects, from ``If-Match: "<v>"`` or ``If-None-Match: *`` (create:
    version 0, the resource must not exist yet). Raises ``PreconditionRequired`` without one."""
    if if_none_match is not None and if_none_match.strip() == "*":
        return 0
    if if_match is None:
        raise PreconditionRequired(
            'edits need If-Match: "<version>" (the ETag you read) or If-None-Match: * to create'
        )
    raw = if_match.strip().removeprefix("W/").strip('"')
    if not raw.isdigit() or len(raw) > 18:
        raise InvalidRequest("If-Match", repr(if_match), 'an ETag read from a GET, e.g. "3"')
    return int(raw)


def refused_edit(
    kind: str, name: str, expected: int, current: int | None, exc: Conflict
) -> PreconditionFailed:
    """The 412 for an edit whose precondition no longer holds. ``If-None-Match: *`` (expected
    version 0) on one that exists says so and names the ETag to send instead, rather than
    "you read version 0"."""
    if expected == 0 and current:
        return PreconditionFailed(
            f"{kind} {name} exists already (version {current}): If-None-Match: * only creates; "
            f'to change it, send If-Match: "{current}" (its ETag)'
        )
    return PreconditionFailed(exc.message)
