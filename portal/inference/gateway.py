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
from dataclasses import dataclass, field
from typing import Annotated

import httpcore
import httpx
from fastapi import APIRouter, Path, Request, Response
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from policies.errors import NotFound, Unavailable
from portal.api.auth import Caller
from portal.api.auth import Scope as PortalScope
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

PREFIX = "/gateway/{tenant}/{service}/v1"
router = APIRouter(prefix=PREFIX, tags=["gateway"], responses=GATEWAY_RESPONSES)

HOLD_POLL_S = 0.05
RETRY_AFTER_S = 5
"""What a refused request is told to wait: about one evaluation of the service loop plus a
replica's health check; an engine's load time is not known in advance."""
FORWARDED = (b"content-type", b"accept")
ServiceName = Annotated[Annotated[str, bounded(KEY, 63)], Path(description="The service's name.")]
TIMEOUT = {"connect": 5.0, "read": 600.0, "write": 60.0, "pool": 60.0}
SHARDS = 8
MAX_CONNECTIONS, MAX_IDLE, IDLE_EXPIRY_S = 125, 16, 5.0
"""Per shard: ``SHARDS`` connection pools, 1,000 connections and 128 idle ones kept in all.
Idle connections to replicas are kept (beyond them, each answer would close its connection
and the next request open a new one), but few per pool: httpcore's pool walks every
connection it holds, polling each idle socket and, for each idle one, counting the whole
pool again, when a request starts and when an answer ends. With hundreds of connections in
one pool that walk cost milliseconds of CPU per request; a request goes to one shard, so it
walks at most 125 and usually 16."""
UNREACHABLE = (
    httpcore.TimeoutException,
    httpcore.NetworkError,
    httpcore.ProtocolError,
    httpcore.UnsupportedProtocol,
    httpcore.ProxyError,
)
"""httpcore's errors of a replica that could not be reached or broke off (httpx's
``TransportError``)."""


@dataclass(slots=True)
class Upstream:
    """A request sent to a replica, its answer's head received; ``Relayed`` passes the body
    on and ``Gateway.done`` closes the books."""

    url: str
    reply: httpcore.Response
    traffic: Traffic
    arrived: float
    open: bool = field(default=True)


class Gateway:
    """Forwards requests to a service's ready replicas and counts them (``TrafficBook``).

    Replicas are called with httpcore's connection pools directly: httpx's client layers
    (auth and redirect flows, cookies, its own request and response models) cost CPU on
    every request and the gateway uses none of them."""

    def __init__(self, controller: ServiceController) -> None:
        self.controller = controller
        self.book: TrafficBook = controller.traffic
        self._turn = itertools.count()
        self._shard = itertools.count()
        self._pools: tuple[httpcore.AsyncConnectionPool, ...] = ()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._urls: dict[tuple[str, str], tuple[httpcore.URL, tuple[bytes, bytes]]] = {}

    def pool(self) -> httpcore.AsyncConnectionPool:
        """The next of ``SHARDS`` connection pools, made per event loop (tests may run several
        loops in turn). They share one TLS context: building one per pool cost a request
        from zero about a second on a loaded host, more than a warm replica's whole wake."""
        loop = asyncio.get_running_loop()
        if not self._pools or self._loop is not loop:
            tls = httpx.create_ssl_context()
            self._pools = tuple(
                httpcore.AsyncConnectionPool(
                    ssl_context=tls,
                    max_connections=MAX_CONNECTIONS,
                    max_keepalive_connections=MAX_IDLE,
                    keepalive_expiry=IDLE_EXPIRY_S,
                )
                for _ in range(SHARDS)
            )
            self._loop = loop
        return self._pools[next(self._shard) % SHARDS]

    def _url(self, base: str, path: str) -> tuple[httpcore.URL, tuple[bytes, bytes]]:
        """A replica's URL and its ``Host`` header, made once (replica URLs are few; the memo
        is cleared when the replicas seen since have grown it past any real count)."""
        hit = self._urls.get((base, path))
        if hit is None:
            if len(self._urls) > 4096:
                self._urls.clear()
            url = httpx.URL(base + path)
            target = httpcore.URL(
                scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
            )
            hit = self._urls[(base, path)] = (target, (b"host", url.netloc))
        return hit

    async def resolve(self, caller: Caller, tenant: str, name: str) -> tuple[str, Hold]:
        caller.require(PortalScope.SERVICES_CALL, tenant)
        route = self.controller.route(tenant, name)
        if route is None:
            route = await run_in_threadpool(self.controller.find_route, tenant, name)
        if route is None:
            raise NotFound("service", f"{tenant}/{name}")
        return route

    async def forward(
        self, request: Request, caller: Caller, tenant: str, name: str, path: str
    ) -> Response:
        """The FastAPI routes' way in: ``open`` with the request's body and headers."""
        headers = [(k, v) for k, v in request.headers.raw if k.lower() in FORWARDED]
        return await self.open(caller, tenant, name, path, await request.body(), headers)

    async def open(
        self,
        caller: Caller,
        tenant: str,
        name: str,
        path: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
    ) -> Relayed:
        """Check the caller, hold while no replica is ready, send to one; the answer's head
        is in, its body is relayed by the ``Relayed`` response returned."""
        arrived = time.monotonic()
        sid, hold = await self.resolve(caller, tenant, name)
        traffic = self.book.of(sid, tenant, name)
        traffic.arrived += 1
        urls = self.controller.ready_urls(sid)
        self.controller.note_request(sid)
        if not urls:
            urls = await self._wake_and_hold(sid, name, hold, traffic)
        traffic.in_flight += 1
        try:
            url, reply = await self._send(sid, name, hold, urls, path, body, headers, traffic)
        except BaseException:
            traffic.in_flight -= 1
            raise
        traffic.first_byte_s.append(time.monotonic() - arrived)
        return Relayed(self, Upstream(url, reply, traffic, arrived))

    async def done(self, up: Upstream, cut: bool) -> None:
        """An answer relayed to its end (or broken off, ``cut``): close it, count it."""
        if not up.open:
            return
        up.open = False
        try:
            await up.reply.aclose()
        finally:
            self.book.leave(up.url)
            up.traffic.in_flight -= 1
            if cut:
                up.traffic.failed += 1
            else:
                up.traffic.served += 1
                up.traffic.total_s.append(time.monotonic() - up.arrived)

    async def _send(
        self,
        sid: str,
        name: str,
        hold: Hold,
        urls: tuple[str, ...],
        path: str,
        body: bytes,
        headers: list[tuple[bytes, bytes]],
        traffic: Traffic,
    ) -> tuple[str, httpcore.Response]:
        """Send to the next ready replica. One that cannot be reached (it ended since it was
        last seen ready) or answers 503 (it does not serve now) is skipped for the others;
        when none is left the request is held once, as from zero, and tried again. The
        replica's in-flight count is taken before the request goes: a draining replica is
        stopped only at zero."""
        pool = self.pool()
        tried: set[str] = set()
        held = False
        length = (b"content-length", str(len(body)).encode())
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
            target, host = self._url(url, path)
            self.book.enter(url)
            try:
                request = httpcore.Request(
                    b"POST",
                    target,
                    headers=[host, length, *headers],
                    content=body,
                    extensions={"timeout": TIMEOUT},
                )
                reply = await pool.handle_async_request(request)
            except UNREACHABLE:
                self.book.leave(url)
                traffic.failed += 1
            except BaseException:
                self.book.leave(url)
                raise
            else:
                if reply.status != 503:
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


class Relayed(Response):
    """A replica's answer passed to the client by plain ASGI messages: a whole answer (it
    says its length) in one message, a stream (server-sent events) chunk by chunk as it
    comes. Starlette's ``StreamingResponse`` would run each answer in a task group of its
    own (uvicorn speaks ASGI 2.3); here a stream alone gets one task, which waits for the
    client to go away and then stops the relay (the replica's request is closed with it)."""

    def __init__(self, gateway: Gateway, up: Upstream) -> None:
        self.gateway = gateway
        self.up = up
        self.status_code = up.reply.status
        self.background = None
        kind = length = None
        for key, value in up.reply.headers:
            low = key.lower()
            if low == b"content-type":
                kind = value
            elif low == b"content-length":
                length = value
        self.raw_headers = [(b"content-type", kind or b"application/json")]
        if length is not None:
            self.raw_headers.append((b"content-length", length))
        self.whole = length is not None
        self.started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        cut = False
        try:
            if self.whole:
                body = b"".join([chunk async for chunk in self.up.reply.aiter_stream()])
                self.started = True
                await send({"type": "http.response.start", "status": self.status_code,
                            "headers": self.raw_headers})  # fmt: skip
                await send({"type": "http.response.body", "body": body})
            else:
                await self._stream(receive, send)
        except UNREACHABLE as exc:
            cut = True  # the engine went away mid-answer: the client's answer breaks too
            if not self.started:
                raise Unavailable(
                    f"the replica's answer broke off ({type(exc).__name__}); retry",
                    retry_after_s=RETRY_AFTER_S,
                ) from exc
            raise
        finally:
            await self.gateway.done(self.up, cut)

    async def _stream(self, receive: Receive, send: Send) -> None:
        relay = asyncio.current_task()
        assert relay is not None
        gone = False

        async def watch() -> None:
            nonlocal gone
            while (await receive())["type"] != "http.disconnect":
                pass
            if not finished:
                gone = True
                relay.cancel()

        finished = False
        watcher = asyncio.create_task(watch())
        try:
            self.started = True
            await send({"type": "http.response.start", "status": self.status_code,
                        "headers": self.raw_headers})  # fmt: skip
            async for chunk in self.up.reply.aiter_stream():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            finished = True
            await send({"type": "http.response.body", "body": b""})
        except asyncio.CancelledError:
            if not gone:
                raise
            relay.uncancel()  # the client went away: nothing left to answer
        finally:
            finished = True
            watcher.cancel()


def models_answer(tenant: str, service: str) -> JSONResponse:
    """The OpenAI model list of a service: its one model, named as the service."""
    card = {"id": service, "object": "model", "created": 0, "owned_by": tenant}
    return JSONResponse({"object": "list", "data": [card]})


def gateway_of(request: Request) -> Gateway:
    gw: Gateway = request.app.state.gateway
    return gw


# The routes below document the gateway (OpenAPI, the API reference) and answer what the
# gateway's own path (``portal.inference.gateway_asgi``, ahead of FastAPI) leaves to them;
# both call the same code.


@router.get("/models", summary="The service's model (OpenAI: list models)")
async def list_models(
    tenant: Annotated[Label, Path(description="The service's tenant.")],
    service: ServiceName,
    request: Request,
    caller: Annotated[Caller, requires(PortalScope.SERVICES_CALL)],
) -> JSONResponse:
    """Answered by the gateway, without waking a service at zero."""
    await gateway_of(request).resolve(caller, tenant, service)
    return models_answer(tenant, service)


@router.post("/chat/completions", summary="OpenAI chat completions, streamed or not")
async def chat_completions(
    tenant: Annotated[Label, Path(description="The service's tenant.")],
    service: ServiceName,
    request: Request,
    caller: Annotated[Caller, requires(PortalScope.SERVICES_CALL)],
) -> Response:
    return await gateway_of(request).forward(
        request, caller, tenant, service, "/v1/chat/completions"
    )


@router.post("/completions", summary="OpenAI completions, streamed or not")
async def completions(
    tenant: Annotated[Label, Path(description="The service's tenant.")],
    service: ServiceName,
    request: Request,
    caller: Annotated[Caller, requires(PortalScope.SERVICES_CALL)],
) -> Response:
    return await gateway_of(request).forward(request, caller, tenant, service, "/v1/completions")
