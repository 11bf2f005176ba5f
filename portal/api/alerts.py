"""``/api/v1/alerts``: the alerts the alert service raised, newest first.

Needs ``workloads:read``. Unfiltered (platform operators) it lists every alert, device alerts
without a tenant included; filtered to a tenant, a tenant admin (``quotas:write`` or ``admin``
for it) or a service sees the tenant's alerts, and a member sees the alerts about their own
workloads (owner: them).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict, Field

from policies.alerts import AlertState
from portal.alerting.store import AlertStore, StoredAlert
from portal.allocator import Allocator
from portal.api.auth import Caller, CallerKind, Scope
from portal.api.deps import Paging, allocator, listed_tenants, paging, requires
from portal.api.errors import ERROR_RESPONSES
from portal.api.inputs import KEY, Label, bounded
from portal.api.schemas import ErrorBody, Page

router = APIRouter(prefix="/alerts", tags=["alerts"], responses=ERROR_RESPONSES)

SHOWN_STATES = (AlertState.PENDING, AlertState.FIRING, AlertState.RESOLVED)


class AlertOut(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(description="Stable id: the same alert keeps it through its states.")
    rule: str = Field(description="idle, noisy_neighbour, memory_over_share, xid, ecc, ...")
    scope: str = Field(description="Where: a device, a GPU, node:<n>, a tenant.")
    subject: str = Field(description="About what: a workload, a device, a flavor, a period.")
    state: AlertState
    tenant: str | None = Field(description="The tenant it is scoped to; null: the platform's.")
    owner: str | None = Field(description="The user it is about; null: none.")
    workloads: list[str] = Field(description="Workloads named; an offender first, then victims.")
    summary: str
    value: float = Field(description="The measured value that tripped the rule.")
    active_since: datetime
    fired_at: datetime | None = Field(description="Null while pending.")
    resolved_at: datetime | None = Field(description="Null until resolved.")


def _time(t: float | None) -> datetime | None:
    return None if t is None else datetime.fromtimestamp(t, UTC)


def _out(s: StoredAlert) -> AlertOut:
    a = s.alert
    return AlertOut(
        id=s.id,
        rule=a.key.rule,
        scope=a.key.scope,
        subject=a.key.subject,
        state=a.state,
        tenant=a.tenant,
        owner=a.owner,
        workloads=list(a.workloads),
        summary=a.summary,
        value=a.value,
        active_since=datetime.fromtimestamp(a.active_since, UTC),
        fired_at=_time(a.fired_at),
        resolved_at=_time(a.resolved_at),
    )


def _sees_whole_tenant(caller: Caller, tenant: str) -> bool:
    return (
        caller.kind is CallerKind.SERVICE
        or caller.can(Scope.QUOTAS_WRITE, tenant)
        or caller.can(Scope.ADMIN, tenant)
    )


@router.get(
    "",
    response_model=Page[AlertOut],
    summary="List alerts",
    responses={404: {"model": ErrorBody, "description": "no such tenant"}},
)
def list_alerts(
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    page: Annotated[Paging, Depends(paging)],
    tenant: Annotated[Label | None, Query(description="Only this tenant.")] = None,
    state: Annotated[
        list[AlertState] | None,
        Query(description="Only these states (repeat); default pending, firing, resolved."),
    ] = None,
    rule: Annotated[
        Annotated[str, bounded(KEY, 64)] | None, Query(description="Only this rule.")
    ] = None,
) -> Page[AlertOut]:
    shown = listed_tenants(caller, Scope.WORKLOADS_READ, tenant, alloc)
    everywhere = caller.can_everywhere(Scope.WORKLOADS_READ)
    stored = AlertStore(alloc.store.engine).alerts(
        states=state or SHOWN_STATES, tenants=shown, rule=rule
    )
    visible = [
        s
        for s in stored
        if everywhere
        or (
            s.alert.tenant is not None
            and (_sees_whole_tenant(caller, s.alert.tenant) or s.alert.owner == caller.name)
        )
    ]
    return page.page([_out(s) for s in visible])
