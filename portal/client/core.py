"""What the sync and async clients share: every request built and every answer read once.

Each operation is a generator that yields ``Call``s and receives the ``httpx.Response`` to each,
then returns its typed result; ``Portal`` and ``AsyncPortal`` only send the calls (``_run``).
Listing all pages of a list is therefore written once too. The answers are the API's own schemas
(``portal.api.schemas``), so there is one definition of every field.
"""

from __future__ import annotations

import uuid
from collections.abc import Generator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import quote

import httpx
from pydantic import BaseModel, ValidationError

from policies.errors import InvalidRequest
from policies.flavors import Flavor, FlavorKind
from policies.requests import WorkloadKind
from portal.api.schemas import (
    MAX_PAGE,
    CapacityOut,
    DevicesIn,
    ElasticIn,
    ElasticOut,
    NodeChangesOut,
    NodeOut,
    Page,
    QueueEntryOut,
    QuotaOut,
    TenantOut,
    UsageOut,
    WorkloadOut,
)
from portal.client.errors import ApiError, error_from_response
from portal.errors import PortalUnreachable
from portal.store.records import WorkloadState

if TYPE_CHECKING:
    # Its module loads FastAPI and the services behind the routes: imported on use only.
    from portal.api.offers import OfferOut

API = "api/v1"
"""Path of the API under the portal's URL (relative: the portal may run under a prefix)."""

RETRY_BACKOFF_S = (0.2, 0.5, 1.0, 2.0)
"""Pause before each retry after a transport failure; the last repeats."""

T = TypeVar("T")
M = TypeVar("M", bound=BaseModel)


Param = str | int | float | Sequence[str]
"""A query parameter's value; a sequence repeats the parameter."""


@dataclass(frozen=True, slots=True)
class Call:
    """One HTTP request, relative to the portal's URL."""

    method: str
    path: str
    params: Mapping[str, Param] = field(default_factory=dict)
    body: Any = None
    headers: Mapping[str, str] = field(default_factory=dict)
    idempotent: bool = False
    """Safe to send again when an answer was lost (GET, DELETE, POST with an idempotency key)."""


Op = Generator[Call, httpx.Response, T]
"""An operation: yields calls, receives their responses, returns the result."""


@dataclass(frozen=True, slots=True)
class Versioned(Generic[T]):
    """A list and the version it was read at; pass ``version`` back as ``since`` to read
    what changed afterwards."""

    value: T
    version: str


@dataclass(frozen=True, slots=True)
class WithETag(Generic[T]):
    """A resource and its ``ETag``; pass ``etag`` back as ``if_match`` to change it."""

    value: T
    etag: str


def http_options(token: str, timeout: float) -> dict[str, Any]:
    """Settings both clients give httpx."""
    return {
        "headers": {"Authorization": f"token {token}", "User-Agent": "gpuportal-client"},
        "timeout": timeout,
    }


def retry_delay(
    url: str, call: Call, exc: httpx.TransportError, attempt: int, retries: int
) -> float:
    """Seconds to wait before sending ``call`` again after ``exc`` on attempt ``attempt``
    (0-based); raises ``PortalUnreachable`` when it must not or may no more.

    A failed connection never reached the server, so any call may go again; after that only
    idempotent calls may, since the server may have acted on the first.
    """
    retryable = isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout) or call.idempotent
    if not retryable or attempt >= retries:
        raise PortalUnreachable(url, exc) from exc
    return RETRY_BACKOFF_S[min(attempt, len(RETRY_BACKOFF_S) - 1)]


UNAVAILABLE_WAIT_S = 30.0
"""How long in all a call the portal answers 503 with ``Retry-After`` (a standby during a
failover, a database restart) is sent again before the error reaches the caller."""
MAX_RETRY_AFTER_S = 10.0
"""The longest single wait taken from a ``Retry-After``."""


def unavailable_delay(
    response: httpx.Response, call: Call, waited_s: float, budget_s: float
) -> float | None:
    """Seconds to wait before sending ``call`` again after ``response``, or None to hand the
    answer to the caller: only a 503 that says when to retry (``Retry-After``), only for a
    call that is safe to repeat, and only while the waits stay within ``budget_s``."""
    if response.status_code != 503 or not call.idempotent:
        return None
    try:
        delay = float(response.headers.get("Retry-After", ""))
    except ValueError:
        return None
    delay = min(max(delay, 0.1), MAX_RETRY_AFTER_S)
    return delay if waited_s + delay <= budget_s else None


def checked(response: httpx.Response) -> Any:
    """The JSON of a successful answer; raises the portal's exception for an error answer."""
    if response.status_code >= 400:
        raise error_from_response(response)
    try:
        return response.json()
    except ValueError as exc:
        raise ApiError(
            response.status_code,
            "error",
            f"{response.request.method} {response.request.url} answered {response.status_code} "
            "without JSON (is the portal URL right?)",
            url=str(response.request.url),
        ) from exc


def _seg(value: str) -> str:
    """One path segment, escaped (``/`` too)."""
    return quote(value, safe="")


def _filters(**values: Param | datetime | None) -> dict[str, Param]:
    """The query without unset filters; times as ISO 8601."""
    return {
        k: v.isoformat() if isinstance(v, datetime) else v
        for k, v in values.items()
        if v is not None
    }


def parsed(model: type[M], data: Any, response: httpx.Response) -> M:
    """``data`` as ``model``; an answer that does not fit is an ``ApiError``, not a crash."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise _unreadable(response, model.__name__, first["loc"], first["msg"]) from exc


def parsed_answer(model: type[M], response: httpx.Response) -> M:
    """A successful answer read as ``model`` straight from its bytes (no intermediate JSON
    objects: large answers allocate half as much, and garbage collection was most of their
    reading time); raises the portal's exception for an error answer, and an ``ApiError``
    for an answer that is not JSON or does not fit."""
    if response.status_code >= 400:
        raise error_from_response(response)
    try:
        return model.model_validate_json(response.content)
    except ValidationError as exc:
        first = exc.errors()[0]
        if first["type"] == "json_invalid":
            checked(response)  # raises: the answer is not JSON at all
        raise _unreadable(response, model.__name__, first["loc"], first["msg"]) from exc


def parsed_page(model: type[M], response: httpx.Response) -> Page[M]:
    """One page of ``model`` items (see ``parsed_answer``); an item that does not fit is
    named by its own field."""
    page_type: type[Page[M]] = Page[model]  # type: ignore[valid-type]
    try:
        return parsed_answer(page_type, response)
    except ApiError as exc:
        cause = exc.__cause__
        if not isinstance(cause, ValidationError):
            raise
        first = cause.errors()[0]
        loc = first["loc"]
        if len(loc) > 2 and loc[0] == "items":
            raise _unreadable(response, model.__name__, loc[2:], first["msg"]) from cause
        raise _unreadable(response, f"page of {model.__name__}", loc, first["msg"]) from cause


def _unreadable(
    response: httpx.Response, what: str, loc: Sequence[int | str], msg: str
) -> ApiError:
    where = ".".join(str(p) for p in loc) or "the body"
    return ApiError(
        response.status_code,
        "error",
        f"{response.request.method} {response.request.url} answered a {what} this client "
        f"cannot read ({where}: {msg}); are the client and the portal the same version?",
        url=str(response.request.url),
    )


# ------------------------------------------------------------------ building blocks


def one(call: Call, model: type[M]) -> Op[M]:
    response = yield call
    return parsed_answer(model, response)


def tagged(call: Call, model: type[M]) -> Op[WithETag[M]]:
    response = yield call
    value = parsed_answer(model, response)
    return WithETag(value, response.headers.get("ETag", ""))


def every_page(
    path: str, model: type[M], page_size: int, params: Mapping[str, Param] | None = None
) -> Op[list[M]]:
    """All items of a paged list, following ``next_offset`` to the last page."""
    items, _first = yield from pages(path, model, page_size, params)
    return items


def pages(
    path: str, model: type[M], page_size: int, params: Mapping[str, Param] | None = None
) -> Op[tuple[list[M], httpx.Response]]:
    """All items of a paged list and the first page's response (for its headers)."""
    items: list[M] = []
    offset = 0
    first: httpx.Response | None = None
    while True:
        query = {**(params or {}), "limit": page_size, "offset": offset}
        response = yield Call("GET", path, query, idempotent=True)
        first = first or response
        page = parsed_page(model, response)
        items.extend(page.items)
        if page.next_offset is None:
            return items, first
        if page.next_offset <= offset:
            raise ApiError(
                500, "error", f"GET {path} paged backwards: next_offset {page.next_offset}"
            )
        offset = page.next_offset


# ------------------------------------------------------------------ the operations


def tenants(page_size: int) -> Op[list[TenantOut]]:
    return (yield from every_page(f"{API}/tenants", TenantOut, page_size))


def tenant(name: str) -> Op[WithETag[TenantOut]]:
    call = Call("GET", f"{API}/tenants/{_seg(name)}", idempotent=True)
    return (yield from tagged(call, TenantOut))


def _conditional(if_match: str | None, create: bool) -> dict[str, str]:
    """``If-Match`` for an edit, ``If-None-Match: *`` to create; neither: the server says 428."""
    if create and if_match is not None:
        raise InvalidRequest("if_match", if_match, "None when create=True (If-None-Match: *)")
    if create:
        return {"If-None-Match": "*"}
    return {} if if_match is None else {"If-Match": if_match}


def set_tenant(
    name: str,
    *,
    cohort: str | None,
    weight: float,
    pools: Sequence[str],
    if_match: str | None,
    create: bool,
) -> Op[WithETag[TenantOut]]:
    headers = _conditional(if_match, create)
    body = {"cohort": cohort, "weight": weight, "pools": list(pools)}
    call = Call("PUT", f"{API}/tenants/{_seg(name)}", body=body, headers=headers)
    return (yield from tagged(call, TenantOut))


def quotas(page_size: int, tenant: str | None) -> Op[list[QuotaOut]]:
    return (yield from every_page(f"{API}/quotas", QuotaOut, page_size, _filters(tenant=tenant)))


def _quota_path(tenant: str, flavor: str) -> str:
    # The route's flavor is a path parameter that may hold '/': H100-80GB/3g.40gb.
    return f"{API}/tenants/{_seg(tenant)}/quotas/{quote(flavor, safe='/')}"


def quota(tenant: str, flavor: str) -> Op[WithETag[QuotaOut]]:
    call = Call("GET", _quota_path(tenant, flavor), idempotent=True)
    return (yield from tagged(call, QuotaOut))


def elastic(tenant: str) -> Op[WithETag[ElasticOut]]:
    call = Call("GET", f"{API}/tenants/{_seg(tenant)}/elastic", idempotent=True)
    return (yield from tagged(call, ElasticOut))


def set_elastic(
    tenant: str, body: ElasticIn, *, if_match: str | None, create: bool
) -> Op[WithETag[ElasticOut]]:
    # Without limits (None) the stored ones are kept: a tenant admin's request leaves them out.
    call = Call(
        "PUT",
        f"{API}/tenants/{_seg(tenant)}/elastic",
        body=body.model_dump(mode="json", exclude_none=True),
        headers=_conditional(if_match, create),
    )
    return (yield from tagged(call, ElasticOut))


def set_quota(
    tenant: str,
    flavor: str,
    *,
    guaranteed: int,
    limit: int,
    budget_gpu_hours: float | None,
    if_match: str | None,
    create: bool,
    ceiling_guaranteed: int | None = None,
    ceiling_limit: int | None = None,
    overcommit: bool = False,
) -> Op[WithETag[QuotaOut]]:
    headers = _conditional(if_match, create)
    body: dict[str, object] = {
        "guaranteed": guaranteed,
        "limit": limit,
        "budget_gpu_hours": budget_gpu_hours,
    }
    # Platform admins only; a tenant admin's request leaves them out.
    if ceiling_guaranteed is not None:
        body["ceiling_guaranteed"] = ceiling_guaranteed
    if ceiling_limit is not None:
        body["ceiling_limit"] = ceiling_limit
    if overcommit:
        body["overcommit"] = True
    call = Call("PUT", _quota_path(tenant, flavor), body=body, headers=headers)
    return (yield from tagged(call, QuotaOut))


def devices_for(
    flavor: str | None, *, count: int, milli: int, gpu_memory_mib: int, devices: DevicesIn | None
) -> DevicesIn:
    """The ``devices`` of a request for ``flavor`` (``H100-80GB``, ``H100-80GB/3g.40gb``,
    ``T4/share``), or ``devices`` as given; neither: CPU only."""
    if devices is not None:
        if flavor is not None:
            raise InvalidRequest("flavor", flavor, "None when devices is given (one or the other)")
        return devices
    if flavor is None:
        return DevicesIn()
    parsed = Flavor.parse(flavor)  # the portal's own parser: same names, same errors
    # Not validated here: the server judges the numbers and names the field that is wrong.
    if parsed.kind is FlavorKind.GPU:
        return DevicesIn.model_construct(kind=parsed.kind, count=count, models=[parsed.model])
    if parsed.kind is FlavorKind.MIG:
        return DevicesIn.model_construct(
            kind=parsed.kind, count=1, models=[parsed.model], mig_profile=parsed.profile
        )
    return DevicesIn.model_construct(
        kind=parsed.kind, models=[parsed.model], milli=milli, gpu_memory_mib=gpu_memory_mib
    )


def request(
    tenant: str,
    devices: DevicesIn,
    *,
    name: str,
    kind: WorkloadKind,
    priority: int,
    gang_size: int,
    expected_duration_s: float | None,
    idempotency_key: str | None,
    owner: str | None = None,
) -> Op[WorkloadOut]:
    body = {
        "tenant": tenant,
        "name": name,
        "kind": str(kind),
        "devices": devices.model_dump(mode="json"),
        "gang_size": gang_size,
        "priority": priority,
        "expected_duration_s": expected_duration_s,
    }
    # One key per logical request, made before the first attempt, so a retry after a lost
    # answer gets the first attempt's workload instead of a second allocation.
    key = idempotency_key or str(uuid.uuid4())
    call = Call(
        "POST",
        f"{API}/workloads",
        _filters(owner=owner),
        body=body,
        headers={"Idempotency-Key": key},
        idempotent=True,
    )
    return (yield from one(call, WorkloadOut))


def status(workload_id: str) -> Op[WorkloadOut]:
    call = Call("GET", f"{API}/workloads/{_seg(workload_id)}", idempotent=True)
    return (yield from one(call, WorkloadOut))


def release(workload_id: str) -> Op[WorkloadOut]:
    # DELETE releases a running workload and cancels a queued one; it is idempotent.
    call = Call("DELETE", f"{API}/workloads/{_seg(workload_id)}", idempotent=True)
    return (yield from one(call, WorkloadOut))


def workloads(
    page_size: int, tenant: str | None, state: WorkloadState | str | None
) -> Op[list[WorkloadOut]]:
    params = _filters(tenant=tenant, state=None if state is None else str(state))
    return (yield from every_page(f"{API}/workloads", WorkloadOut, page_size, params))


def queue(page_size: int, tenant: str | None) -> Op[list[QueueEntryOut]]:
    params = _filters(tenant=tenant)
    return (yield from every_page(f"{API}/queue", QueueEntryOut, page_size, params))


def usage(page_size: int, tenant: str | None) -> Op[list[UsageOut]]:
    return (yield from every_page(f"{API}/usage", UsageOut, page_size, _filters(tenant=tenant)))


def nodes(page_size: int, topology: bool = True) -> Op[list[NodeOut]]:
    return (yield from versioned_nodes(page_size, topology)).value


def versioned_nodes(page_size: int, topology: bool = True) -> Op[Versioned[list[NodeOut]]]:
    params: dict[str, Param] = {} if topology else {"topology": "false"}
    items, first = yield from pages(f"{API}/nodes", NodeOut, page_size, params)
    return Versioned(items, first.headers.get("Inventory-Version", ""))


def node_changes(since: str, topology: bool = True) -> Op[NodeChangesOut]:
    params: dict[str, Param] = {"since": since}
    if not topology:
        params["topology"] = "false"
    call = Call("GET", f"{API}/inventory/changes", params, idempotent=True)
    return (yield from one(call, NodeChangesOut))


def node(name: str) -> Op[NodeOut]:
    return (yield from one(Call("GET", f"{API}/nodes/{_seg(name)}", idempotent=True), NodeOut))


def capacity() -> Op[list[CapacityOut]]:
    response = yield Call("GET", f"{API}/capacity", idempotent=True)
    return [parsed(CapacityOut, item, response) for item in checked(response)]


def offers(tenant: str) -> Op[list[OfferOut]]:
    from portal.api.offers import OfferOut

    response = yield Call("GET", f"{API}/tenants/{_seg(tenant)}/offers", idempotent=True)
    return [parsed(OfferOut, item, response) for item in checked(response)]


def next_poll(w: WorkloadOut, left_s: float, poll_s: float) -> float | None:
    """Seconds until ``wait`` asks again about ``w``; None when it is done waiting: ``w`` left
    the queue (running, or ended), or no time is left."""
    if w.state is not WorkloadState.QUEUED or left_s <= 0:
        return None
    return min(poll_s, left_s)


def check_page_size(page_size: int) -> int:
    if not 1 <= page_size <= MAX_PAGE:
        raise InvalidRequest("page_size", page_size, f"1..{MAX_PAGE}")
    return page_size
