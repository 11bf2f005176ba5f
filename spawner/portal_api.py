"""The portal calls a spawner makes: ``AsyncPortal`` plus offers and requests on a user's behalf.

The hub's spawner authenticates as a hub service (the portal's own, by default) and asks for
devices *for* a user: the workload's owner is the user, and the service vouches for the user's
membership of the tenant, which the spawner checks against the user's hub groups first.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote, urlencode

from portal.api.offers import OfferOut
from portal.api.schemas import DevicesIn, WorkloadOut
from portal.client.aio import AsyncPortal
from portal.client.core import API, Call, Op, checked, one


def _offers(tenant: str, keys: Sequence[str] | None) -> Op[list[OfferOut]]:
    path = f"{API}/tenants/{quote(tenant, safe='')}/offers"
    if keys is not None:
        path += "?" + urlencode([("option", k) for k in keys])
    call = Call("GET", path, idempotent=True)
    response = yield call
    body: list[Any] = checked(response)
    return [OfferOut.model_validate(item) for item in body]


def _request_for(
    owner: str,
    tenant: str,
    devices: DevicesIn,
    name: str,
    idempotency_key: str,
    option: str | None,
) -> Op[WorkloadOut]:
    body = {
        "tenant": tenant,
        "name": name,
        "kind": "notebook",
        "devices": devices.model_dump(mode="json"),
        # The offer picked: the portal hands the spawn a pre-started placeholder of it.
        "option": option,
    }
    # The key makes a retry (or a hub restarted mid-spawn) find the first request's workload,
    # queue place included, instead of asking again.
    call = Call(
        "POST",
        f"{API}/workloads",
        params={"owner": owner},
        body=body,
        headers={"Idempotency-Key": idempotency_key},
        idempotent=True,
    )
    return (yield from one(call, WorkloadOut))


class SpawnerPortal(AsyncPortal):
    """``AsyncPortal`` with the two calls only a spawner makes."""

    async def __aenter__(self) -> SpawnerPortal:
        return self

    async def offers(self, tenant: str, keys: Sequence[str] | None = None) -> list[OfferOut]:
        """Every option for ``tenant`` with its state (``GET /tenants/{tenant}/offers``); only
        the options named in ``keys`` when given."""
        return await self._run(_offers(tenant, keys))

    async def request_for(
        self,
        owner: str,
        tenant: str,
        devices: DevicesIn,
        *,
        name: str,
        idempotency_key: str,
        option: str | None,
    ) -> WorkloadOut:
        """Request ``devices`` (the offer ``option``) for user ``owner`` charged to
        ``tenant``; running or queued."""
        return await self._run(_request_for(owner, tenant, devices, name, idempotency_key, option))
