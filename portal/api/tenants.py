"""``/api/v1/tenants``: tenants (JupyterHub groups) with their cohort, weight and pools."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Response

from policies.errors import Conflict, Forbidden, NotFound
from portal.allocator import Allocator
from portal.api import convert
from portal.api.auth import Caller, Scope
from portal.api.deps import (
    Paging,
    allocator,
    etag,
    expected_version,
    paging,
    refused_edit,
    requires,
)
from portal.api.deps import visible_tenants as _visible
from portal.api.errors import ERROR_RESPONSES, Responses
from portal.api.inputs import Label
from portal.api.schemas import ErrorBody, Page, TenantIn, TenantOut

router = APIRouter(prefix="/tenants", tags=["tenants"], responses=ERROR_RESPONSES)

TenantName = Annotated[Label, Path(description="The tenant (JupyterHub group).")]
IfMatch = Annotated[str | None, Header(description='The ETag read, e.g. "3".')]
IfNoneMatch = Annotated[str | None, Header(description="`*`: create only.")]

_404: Responses = {404: {"model": ErrorBody, "description": "no such tenant"}}
_EDIT: Responses = {
    **_404,
    412: {"model": ErrorBody, "description": "changed since the ETag was read"},
    428: {"model": ErrorBody, "description": "If-Match missing"},
}


@router.get("", response_model=Page[TenantOut], summary="List tenants")
def list_tenants(
    caller: Annotated[Caller, requires(Scope.QUOTAS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    page: Annotated[Paging, Depends(paging)],
) -> Page[TenantOut]:
    shown = _visible(caller, Scope.QUOTAS_READ, None)
    tenants = [convert.tenant_out(t) for t in alloc.tenants() if shown is None or t.name in shown]
    return page.page(tenants)


@router.get("/{tenant}", response_model=TenantOut, responses=_404, summary="Read a tenant")
def get_tenant(
    tenant: TenantName,
    response: Response,
    caller: Annotated[Caller, requires(Scope.QUOTAS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
) -> TenantOut:
    caller.require(Scope.QUOTAS_READ, tenant)
    for t in alloc.tenants():
        if t.name == tenant:
            response.headers["ETag"] = etag(t.version)
            return convert.tenant_out(t)
    raise NotFound("tenant", tenant)


@router.put(
    "/{tenant}",
    response_model=TenantOut,
    responses=_EDIT,
    summary="Create or change a tenant (platform admins)",
)
def put_tenant(
    tenant: TenantName,
    body: TenantIn,
    response: Response,
    caller: Annotated[Caller, requires(Scope.ADMIN)],
    alloc: Annotated[Allocator, Depends(allocator)],
    if_match: IfMatch = None,
    if_none_match: IfNoneMatch = None,
) -> TenantOut:
    # Weight and cohort shape fairness between tenants: only unfiltered admins change them.
    if not caller.can_everywhere(Scope.ADMIN):
        raise Forbidden(f"{caller.kind} {caller.name} needs {Scope.ADMIN} without a filter")
    expected = expected_version(if_match, if_none_match)
    try:
        rec = alloc.set_tenant(
            tenant,
            cohort=body.cohort,
            weight=body.weight,
            pools=body.pools,
            expected_version=expected,
        )
    except Conflict as exc:
        current = next((t.version for t in alloc.tenants() if t.name == tenant), None)
        raise refused_edit("tenant", tenant, expected, current, exc) from exc
    response.headers["ETag"] = etag(rec.version)
    return convert.tenant_out(rec)
