"""Inference services from Python: ``Portal().services.deploy(...)`` returns a ``Service``.

::

    llm = Portal().services.deploy(
        "team-a", "llm", model_uri="file:///models/tiny", digest="sha256:...",
        flavor="H100-80GB", preset="vllm", min_replicas=0, max_replicas=4,
    )
    llm.wait_ready()
    from openai import OpenAI                      # any OpenAI client
    client = OpenAI(base_url=llm.base_url, api_key=llm.api_key)
    client.chat.completions.create(model="llm", messages=[{"role": "user", "content": "hi"}])

The API key is the notebook's own hub token; it needs ``custom:gpuportal:services:call`` for
the service's tenant (members hold it).
"""

from __future__ import annotations

import asyncio
import builtins
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from portal.client import core
from portal.client.core import API, Call, Op, _filters, _seg
from portal.errors import Unavailable

if TYPE_CHECKING:
    from portal.api.schemas import DevicesIn
    from portal.api.services import CacheEntryOut, EventOut, LogOut, ReplicaOut, ServiceOut
    from portal.client.aio import AsyncPortal
    from portal.client.sync import Portal


def deploy(body: Mapping[str, Any]) -> Op[ServiceOut]:
    from portal.api.services import ServiceOut

    return (yield from core.one(Call("POST", f"{API}/services", body=dict(body)), ServiceOut))


def get(service_id: str) -> Op[ServiceOut]:
    from portal.api.services import ServiceOut

    call = Call("GET", f"{API}/services/{_seg(service_id)}", idempotent=True)
    return (yield from core.one(call, ServiceOut))


def listed(page_size: int, tenant: str | None) -> Op[list[ServiceOut]]:
    from portal.api.services import ServiceOut

    params = _filters(tenant=tenant)
    return (yield from core.every_page(f"{API}/services", ServiceOut, page_size, params))


def cache(page_size: int, tenant: str | None, node: str | None) -> Op[list[CacheEntryOut]]:
    from portal.api.services import CacheEntryOut

    params = _filters(tenant=tenant, node=node)
    return (yield from core.every_page(f"{API}/services/cache", CacheEntryOut, page_size, params))


def patch(service_id: str, body: Mapping[str, Any]) -> Op[ServiceOut]:
    from portal.api.services import ServiceOut

    call = Call("PATCH", f"{API}/services/{_seg(service_id)}", body=dict(body), idempotent=True)
    return (yield from core.one(call, ServiceOut))


def delete(service_id: str) -> Op[ServiceOut]:
    from portal.api.services import ServiceOut

    call = Call("DELETE", f"{API}/services/{_seg(service_id)}", idempotent=True)
    return (yield from core.one(call, ServiceOut))


def replicas(service_id: str, page_size: int) -> Op[list[ReplicaOut]]:
    from portal.api.services import ReplicaOut

    path = f"{API}/services/{_seg(service_id)}/replicas"
    return (yield from core.every_page(path, ReplicaOut, page_size))


def events(service_id: str, page_size: int) -> Op[list[EventOut]]:
    from portal.api.services import EventOut

    path = f"{API}/services/{_seg(service_id)}/events"
    return (yield from core.every_page(path, EventOut, page_size))


def logs(service_id: str, replica: int, offset: int) -> Op[LogOut]:
    from portal.api.services import LogOut

    params = _filters(replica=replica, offset=offset)
    call = Call("GET", f"{API}/services/{_seg(service_id)}/logs", params, idempotent=True)
    return (yield from core.one(call, LogOut))


def deploy_body(
    tenant: str,
    name: str,
    *,
    model_uri: str,
    digest: str,
    devices: DevicesIn,
    preset: str,
    args: Sequence[str],
    command: Sequence[str],
    env: Mapping[str, str] | None,
    min_replicas: int,
    max_replicas: int,
    warm: int,
    scaling: Mapping[str, Any] | None,
    hold: Mapping[str, Any] | None,
    priority: int,
) -> dict[str, Any]:
    """The ``POST /services`` body; the server checks every value and names the one wrong."""
    return {
        "tenant": tenant,
        "name": name,
        "engine": {
            "preset": preset,
            "args": list(args),
            "command": list(command),
            "env": dict(env or {}),
        },
        "model": {"uri": model_uri, "digest": digest},
        "devices": devices.model_dump(mode="json"),
        "replicas": {"min": min_replicas, "max": max_replicas, "warm": warm},
        "scaling": dict(scaling or {}),
        "hold": dict(hold or {}),
        "priority": priority,
    }


def scale(
    service_id: str,
    min_replicas: int | None,
    max_replicas: int | None,
    warm: int | None,
    scaling: Mapping[str, Any] | None,
) -> Op[ServiceOut]:
    """New replica bounds or a new scaling rule. The API takes the bounds whole, so the unset
    ones keep the value the service has when read first."""
    body: dict[str, Any] = {}
    if (min_replicas, max_replicas, warm) != (None, None, None):
        held = (yield from get(service_id)).spec["replicas"]
        body["replicas"] = {
            "min": held["min"] if min_replicas is None else min_replicas,
            "max": held["max"] if max_replicas is None else max_replicas,
            "warm": held["warm"] if warm is None else warm,
        }
    if scaling is not None:
        body["scaling"] = dict(scaling)
    return (yield from patch(service_id, body))


def whole_log(service_id: str, replica: int) -> Op[str]:
    """What replica ``replica``'s engine has printed so far, read page by page."""
    text: list[str] = []
    offset = 0
    while True:
        log = yield from logs(service_id, replica, offset)
        if not log.text:
            return "".join(text)
        text.append(log.text)
        offset = log.next_offset


def not_ready(info: ServiceOut, replicas: int, timeout_s: float) -> Unavailable:
    """What ``wait_ready`` raises when ``replicas`` replicas do not serve in ``timeout_s``."""
    return Unavailable(
        f"service {info.name}: {info.ready} of {replicas} replicas ready "
        f"after {timeout_s:g} s ({info.message})"
    )


class Services:
    """``Portal().services``: deploy, read, list, scale and delete inference services."""

    def __init__(self, portal: Portal) -> None:
        self._portal = portal

    def deploy(
        self,
        tenant: str,
        name: str,
        *,
        model_uri: str,
        digest: str,
        flavor: str | None = None,
        count: int = 1,
        milli: int = 0,
        gpu_memory_mib: int = 0,
        devices: DevicesIn | None = None,
        preset: str = "vllm",
        args: Sequence[str] = (),
        command: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        min_replicas: int = 1,
        max_replicas: int = 1,
        warm: int = 0,
        scaling: Mapping[str, Any] | None = None,
        hold: Mapping[str, Any] | None = None,
        priority: int = 0,
    ) -> Service:
        """Deploy ``name`` (its model id in the OpenAI API) charged to ``tenant``: replicas
        of the engine ``preset`` (vllm, sglang, tgi, test, or custom with ``command``) each
        with ``count`` GPUs of ``flavor`` (or a MIG instance, a share, or ``devices``),
        serving the model at ``model_uri`` whose files hash to ``digest``. ``scaling``:
        metric, target, up_window_s, down_window_s, idle_s; ``hold``: max_requests,
        timeout_s (``docs/services.md``)."""
        want = core.devices_for(
            flavor, count=count, milli=milli, gpu_memory_mib=gpu_memory_mib, devices=devices
        )
        body = deploy_body(
            tenant,
            name,
            model_uri=model_uri,
            digest=digest,
            devices=want,
            preset=preset,
            args=args,
            command=command,
            env=env,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            warm=warm,
            scaling=scaling,
            hold=hold,
            priority=priority,
        )
        return Service(self, self._portal._run(deploy(body)))

    def get(self, service_id: str) -> Service:
        return Service(self, self._portal._run(get(service_id)))

    def list(self, tenant: str | None = None) -> builtins.list[Service]:
        """Every service the token may read, deleted ones included, oldest first."""
        found = self._portal._run(listed(self._portal._page_size, tenant))
        return [Service(self, s) for s in found]

    def cache(
        self, tenant: str | None = None, node: str | None = None
    ) -> builtins.list[CacheEntryOut]:
        """The weight cache's entries per node and tenant that the token may read."""
        return self._portal._run(cache(self._portal._page_size, tenant, node))

    def scale(
        self,
        service_id: str,
        *,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        warm: int | None = None,
        scaling: Mapping[str, Any] | None = None,
    ) -> ServiceOut:
        """New replica bounds (unset ones keep their value) or a new scaling rule."""
        return self._portal._run(scale(service_id, min_replicas, max_replicas, warm, scaling))

    def delete(self, service_id: str) -> ServiceOut:
        return self._portal._run(delete(service_id))

    def replicas(self, service_id: str) -> builtins.list[ReplicaOut]:
        return self._portal._run(replicas(service_id, self._portal._page_size))

    def events(self, service_id: str) -> builtins.list[EventOut]:
        return self._portal._run(events(service_id, self._portal._page_size))

    def read_logs(self, service_id: str, replica: int, offset: int = 0) -> LogOut:
        return self._portal._run(logs(service_id, replica, offset))


class Service:
    """A handle on one service; ``info`` is its last answer (``refresh`` reads it again)."""

    def __init__(self, services: Services, info: ServiceOut) -> None:
        self._services = services
        self.info = info

    def __repr__(self) -> str:
        return f"Service({self.info.tenant}/{self.info.name}, ready={self.info.ready})"

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def base_url(self) -> str:
        """The OpenAI ``base_url`` of the service (the portal's gateway)."""
        return f"{self._services._portal.url.rstrip('/')}/{self.info.gateway}"

    @property
    def api_key(self) -> str:
        """The token this client uses: the OpenAI ``api_key`` for the gateway."""
        header = self._services._portal._http.headers["Authorization"]
        return header.partition(" ")[2]

    def refresh(self) -> ServiceOut:
        self.info = self._services._portal._run(get(self.id))
        return self.info

    def wait_ready(
        self, replicas: int = 1, *, timeout_s: float = 600.0, poll_s: float = 1.0
    ) -> ServiceOut:
        """Return once ``replicas`` replicas serve; raise ``Unavailable`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while self.refresh().ready < replicas:
            if time.monotonic() >= deadline:
                raise not_ready(self.info, replicas, timeout_s)
            time.sleep(poll_s)
        return self.info

    def scale(self, **kw: Any) -> ServiceOut:
        self.info = self._services.scale(self.id, **kw)
        return self.info

    def delete(self) -> ServiceOut:
        self.info = self._services.delete(self.id)
        return self.info

    def logs(self, replica: int = 1) -> str:
        """What replica ``replica``'s engine has printed so far."""
        return self._services._portal._run(whole_log(self.id, replica))


class AsyncServices:
    """``AsyncPortal().services``: the calls of ``Services`` as coroutines, answering the API's
    records (``ServiceOut``); ``wait_ready`` polls as ``Service.wait_ready`` does."""

    def __init__(self, portal: AsyncPortal) -> None:
        self._portal = portal

    async def deploy(
        self,
        tenant: str,
        name: str,
        *,
        model_uri: str,
        digest: str,
        flavor: str | None = None,
        count: int = 1,
        milli: int = 0,
        gpu_memory_mib: int = 0,
        devices: DevicesIn | None = None,
        preset: str = "vllm",
        args: Sequence[str] = (),
        command: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        min_replicas: int = 1,
        max_replicas: int = 1,
        warm: int = 0,
        scaling: Mapping[str, Any] | None = None,
        hold: Mapping[str, Any] | None = None,
        priority: int = 0,
    ) -> ServiceOut:
        """``Services.deploy``, answering the service's record."""
        want = core.devices_for(
            flavor, count=count, milli=milli, gpu_memory_mib=gpu_memory_mib, devices=devices
        )
        body = deploy_body(
            tenant,
            name,
            model_uri=model_uri,
            digest=digest,
            devices=want,
            preset=preset,
            args=args,
            command=command,
            env=env,
            min_replicas=min_replicas,
            max_replicas=max_replicas,
            warm=warm,
            scaling=scaling,
            hold=hold,
            priority=priority,
        )
        return await self._portal._run(deploy(body))

    async def get(self, service_id: str) -> ServiceOut:
        return await self._portal._run(get(service_id))

    async def list(self, tenant: str | None = None) -> builtins.list[ServiceOut]:
        """Every service the token may read, deleted ones included, oldest first."""
        return await self._portal._run(listed(self._portal._page_size, tenant))

    async def cache(
        self, tenant: str | None = None, node: str | None = None
    ) -> builtins.list[CacheEntryOut]:
        return await self._portal._run(cache(self._portal._page_size, tenant, node))

    async def scale(
        self,
        service_id: str,
        *,
        min_replicas: int | None = None,
        max_replicas: int | None = None,
        warm: int | None = None,
        scaling: Mapping[str, Any] | None = None,
    ) -> ServiceOut:
        return await self._portal._run(scale(service_id, min_replicas, max_replicas, warm, scaling))

    async def delete(self, service_id: str) -> ServiceOut:
        return await self._portal._run(delete(service_id))

    async def replicas(self, service_id: str) -> builtins.list[ReplicaOut]:
        return await self._portal._run(replicas(service_id, self._portal._page_size))

    async def events(self, service_id: str) -> builtins.list[EventOut]:
        return await self._portal._run(events(service_id, self._portal._page_size))

    async def read_logs(self, service_id: str, replica: int, offset: int = 0) -> LogOut:
        return await self._portal._run(logs(service_id, replica, offset))

    async def logs(self, service_id: str, replica: int = 1) -> str:
        """What replica ``replica``'s engine has printed so far."""
        return await self._portal._run(whole_log(service_id, replica))

    async def wait_ready(
        self, service_id: str, replicas: int = 1, *, timeout_s: float = 600.0, poll_s: float = 1.0
    ) -> ServiceOut:
        """Return once ``replicas`` replicas serve; raise ``Unavailable`` after ``timeout_s``."""
        deadline = time.monotonic() + timeout_s
        while (info := await self.get(service_id)).ready < replicas:
            if time.monotonic() >= deadline:
                raise not_ready(info, replicas, timeout_s)
            await asyncio.sleep(poll_s)
        return info
