"""The gateway: an OpenAI-compatible API per service, in the portal, in front of its replicas.

``{portal}/gateway/{tenant}/{service}/v1`` is the ``base_url`` of an OpenAI client whose API
key is a JupyterHub token holding ``custom:gpuportal:services:call`` for the tenant (members
get it filtered to their tenant). ``/models`` is answered here; ``/chat/completions`` and
``/completions`` are passed to a ready replica (round robin), streamed back as they come, so
server-sent events reach the client token by token. The caller's token never reaches the
engine: only the body and its content type are forwarded.

While no replica is ready (the service scales from zero, or its replicas are starting), a
request is **held**: the service is told a request came (which brings a service at zero back
to one replica) and the request waits until a replica is ready, at most ``hold.timeout_s``;
at most ``hold.max_requests`` are held at once. Beyond either, 503 with ``Retry-After``.

A replica chosen for removal drains (``portal.inference.drain``): it leaves the rotation and
is stopped once nothing the gateway sent it is still in flight. A request whose replica went
away anyway (it cannot be reached, or answers 503) is sent to another ready one, or held once.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from typing import Annotated

import httpx
from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import run_in_threadpool

from policies.errors import NotFound, Unavailable
from portal.api.auth import Caller, Scope
from portal.api.deps import requires
from portal.api.errors import ERROR_RESPONSES, Responses
from portal.api.inputs import KEY, Label, bounded
from portal.api.schemas import ErrorBody
from portal.inference.controller import ServiceController
from portal.inference.spec import Hold
from portal.inference.traffic import Traffic, TrafficBook

GATEWAY_RESPONSES: Responses = {
    **ERROR_RESPONSES,
    404: {"model": ErrorBody, "description": "no such service in that tenant"},
    503: {
        "model": ErrorBody,
        "description": "no replica ready within the hold (or the hold is full): see Retry-After",
    },
}

router = APIRouter(
    prefix="/gateway/{tenant}/{service}/v1", tags=["gateway"], responses=GATEWAY_RESPONSES
)

HOLD_POLL_S = 0.05
RETRY_AFTER_S = 5
"""What a refused request is told to wait: about one evaluation of the service loop plus a
replica's health check; an engine's load time is not known in advance."""
FORWARDED = ("content-type", "accept")
ServiceName = Annotated[Annotated[str, bounded(KEY, 63)], Path(description="The service's name.")]
TIMEOUT = httpx.Timeout(connect=5.0, read=600.0, write=60.0, pool=60.0)
SHARDS = 8
LIMITS = httpx.Limits(max_connections=125, max_keepalive_connections=16)
"""Per shard: ``SHARDS`` pooled clients, 1,000 connections and 128 idle ones kept in all.
Idle connections to replicas are kept (beyond them, each answer would close its connection
and the next request open a new one), but few per pool: httpcore's pool walks every
connection it holds, polling each idle socket and, for each idle one, counting the whole
pool again, when a request starts and when an answer ends. With hundreds of connections in
one pool that walk cost milliseconds of CPU per request; a request goes to one shard, so it
walks at most 125 and usually 16."""


class Gateway:
    """Forwards requests to a service's ready replicas and counts them (``TrafficBook``)."""

    def __init__(self, controller: ServiceController) -> None:
        self.controller = controller
        self.book: TrafficBook = controller.traffic
        self._turn = itertools.count()
        self._shard = itertools.count()
        self._clients: tuple[httpx.AsyncClient, ...] = ()
        self._loop: asyncio.AbstractEventLoop | None = None

    def client(self) -> httpx.AsyncClient:
        """The next of ``SHARDS`` pooled clients, made per event loop (tests may run several
        loops in turn). They share one TLS context: building one per client cost a request
        from zero about a second on a loaded host, more than a warm replica's whole wake."""
        loop = asyncio.get_running_loop()
        if not self._clients or self._loop is not loop:
            tls = httpx.create_ssl_context()
            self._clients = tuple(
                httpx.AsyncClient(timeout=TIMEOUT, limits=LIMITS, verify=tls) for _ in range(SHARDS)
            )
            self._loop = loop
        return self._clients[next(self._shard) % SHARDS]

    async def resolve(self, caller: Caller, tenant: str, name: str) -> tuple[str, Hold]:
        caller.require(Scope.SERVICES_CALL, tenant)
        route = self.controller.route(tenant, name)
        if route is None:
            route = await run_in_threadpool(self.controller.find_route, tenant, name)
        if route is None:
            raise NotFound("service", f"{tenant}/{name}")
        return route

    async def forward(
        self, request: Request, caller: Caller, tenant: str, name: str, path: str
    ) -> Response:
        arrived = time.monotonic()
        sid, hold = await self.resolve(caller, tenant, name)
        traffic = self.book.of(sid, tenant, name)
        traffic.arrived += 1
        body = await request.body()
        urls = self.controller.ready_urls(sid)
        self.controller.note_request(sid)
        if not urls:
            urls = await self._wake_and_hold(sid, name, hold, traffic)
        headers = {k: v for k, v in request.headers.items() if k.lower() in FORWARDED}
        traffic.in_flight += 1
        try:
            url, reply = await self._send(sid, name, hold, urls, path, body, headers, traffic)
        except BaseException:
            traffic.in_flight -= 1
            raise
        traffic.first_byte_s.append(time.monotonic() - arrived)

        async def relay() -> AsyncIterator[bytes]:
            cut = False
            try:
                async for chunk in reply.aiter_raw():
                    yield chunk
            except httpx.TransportError:
                cut = True  # the engine went away mid-answer: the client's stream breaks too
                raise
            finally:
                await reply.aclose()
                self.book.leave(url)
                traffic.in_flight -= 1
                if cut:
                    traffic.failed += 1
                else:
                    traffic.served += 1
                    traffic.total_s.append(time.monotonic() - arrived)

        kept = {"content-type": reply.headers.get("content-type", "application/json")}
        return StreamingResponse(relay(), status_code=reply.status_code, headers=kept)

    async def _send(
        self,
        sid: str,
        name: str,
        hold: Hold,
        urls: tuple[str, ...],
        path: str,
        body: bytes,
        headers: dict[str, str],
        traffic: Traffic,
    ) -> tuple[str, httpx.Response]:
        """Send to the next ready replica. One that cannot be reached (it ended since it was
        last seen ready) or answers 503 (it does not serve now) is skipped for the others;
        when none is left the request is held once, as from zero, and tried again. The
        replica's in-flight count is taken before the request goes: a draining replica is
        stopped only at zero."""
        client = self.client()
        tried: set[str] = set()
        held = False
        while True:
            left = [u for u in urls if u not in tried]
            if not left and not held:
                held = True
                urls = await self._wake_and_hold(sid, name, hold, traffic, frozenset(tried))
                continue
            if not left:
                raise Unavailable(
                    "no replica of the service could be reached; retry", retry_after_s=RETRY_AFTER_S
                )
            url = left[next(self._turn) % len(left)]
            self.book.enter(url)
            try:
                request = client.build_request("POST", url + path, content=body, headers=headers)
                reply = await client.send(request, stream=True)
            except httpx.TransportError:
                self.book.leave(url)
                traffic.failed += 1
            except BaseException:
                self.book.leave(url)
                raise
            else:
                if reply.status_code != 503:
                    return url, reply
                await reply.aclose()
                self.book.leave(url)
            tried.add(url)
            urls = self.controller.ready_urls(sid)

    async def _wake_and_hold(
        self, sid: str, name: str, hold: Hold, traffic: Traffic, gone: frozenset[str] = frozenset()
    ) -> tuple[str, ...]:
        await run_in_threadpool(self.controller.touch, sid)
        return await self._hold(sid, name, hold, traffic, gone)

    async def _hold(
        self, sid: str, name: str, hold: Hold, traffic: Traffic, gone: frozenset[str] = frozenset()
    ) -> tuple[str, ...]:
        """Wait for a ready replica other than those ``gone`` (they failed this request: the
        service loop has not noticed yet)."""
        if traffic.held >= hold.max_requests:
            traffic.refused += 1
            raise Unavailable(
                f"service {name} has no ready replica and holds {traffic.held} requests already "
                f"(its hold.max_requests); retry in {RETRY_AFTER_S} s",
                retry_after_s=RETRY_AFTER_S,
            )
        traffic.held += 1
        traffic.held_total += 1
        try:
            deadline = time.monotonic() + hold.timeout_s
            while not (urls := tuple(u for u in self.controller.ready_urls(sid) if u not in gone)):
                if time.monotonic() >= deadline:
                    traffic.refused += 1
                    raise Unavailable(
                        f"no replica of service {name} became ready within {hold.timeout_s:g} s "
                        "(its hold.timeout_s); retry",
                        retry_after_s=RETRY_AFTER_S,
                    )
                await asyncio.sleep(HOLD_POLL_S)
            return urls
        finally:
            traffic.held -= 1


def gateway_of(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


@router.get("/models", summary="The service's model (OpenAI: list models)")
async def list_models(
    tenant: Annotated[Label, Path(description="The service's tenant.")],
    service: ServiceName,
    request: Request,
    caller: Annotated[Caller, requires(Scope.SERVICES_CALL)],
) -> JSONResponse:
    """Answered by the gateway, without waking a service at zero."""
    await gateway_of(request).resolve(caller, tenant, service)
    card = {"id": service, "object": "model", "created": 0, "owned_by": tenant}
    return JSONResponse({"object": "list", "data": [card]})


@router.post("/chat/completions", summary="OpenAI chat completions, streamed or not")
async def chat_completions(
    tenant: Annotated[Label, Path(description="The service's tenant.")],
    service: ServiceName,
    request: Request,
    caller: Annotated[Caller, requires(Scope.SERVICES_CALL)],
) -> Response:
    return await gateway_of(request).forward(
        request, caller, tenant, service, "/v1/chat/completions"
    )


@router.post("/completions", summary="OpenAI completions, streamed or not")
async def completions(
    tenant: Annotated[Label, Path(description="The service's tenant.")],
    service: ServiceName,
    request: Request,
    caller: Annotated[Caller, requires(Scope.SERVICES_CALL)],
) -> Response:
    return await gateway_of(request).forward(request, caller, tenant, service, "/v1/completions")
