"""``/api/v1/quotas`` and ``/api/v1/tenants/{tenant}/quotas/{flavor}``: quotas per flavor."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Response

from policies.errors import Conflict, Forbidden, InvalidRequest, NotFound
from policies.flavors import Flavor
from portal.allocator import Allocator
from portal.api import convert
from portal.api.auth import Caller, Scope
from portal.api.deps import (
    Paging,
    allocator,
    etag,
    expected_version,
    listed_tenants,
    paging,
    refused_edit,
    requires,
)
from portal.api.errors import ERROR_RESPONSES, Responses
from portal.api.inputs import KEY, Label, bounded
from portal.api.schemas import ErrorBody, Page, QuotaIn, QuotaOut

router = APIRouter(tags=["quotas"], responses=ERROR_RESPONSES)

TenantName = Annotated[Label, Path(description="The tenant (JupyterHub group).")]
FlavorName = Annotated[
    Annotated[str, bounded(KEY, 128)],
    Path(description="A flavor: `H100-80GB`, `H100-80GB/3g.40gb`, …"),
]
_404: Responses = {404: {"model": ErrorBody, "description": "no such tenant, flavor or quota"}}
_EDIT: Responses = {
    **_404,
    403: {
        "model": ErrorBody,
        "description": "not this tenant's admin, above the platform's ceiling, or a "
        "ceiling or over-commit from someone other than a platform admin",
    },
    412: {"model": ErrorBody, "description": "changed since the ETag was read"},
    428: {"model": ErrorBody, "description": "If-Match missing"},
}


def _offered_flavor(alloc: Allocator, tenant: str, flavor: str) -> str:
    """``flavor``'s canonical name, if the inventory offers it: a quota for a flavor no node
    has could never be used, and is most often a typo (``A100-80G``). A quota the tenant
    already holds stays editable after its nodes left, so it can be lowered or zeroed."""
    canonical = str(Flavor.parse(flavor))
    offered = alloc.capacity
    if canonical in offered or any(q.flavor == canonical for q in alloc.quotas(tenant)):
        return canonical
    raise InvalidRequest(
        "flavor",
        repr(flavor),
        "a flavor the inventory offers: " + (", ".join(sorted(offered)) or "none yet"),
    )


@router.get(
    "/quotas",
    response_model=Page[QuotaOut],
    summary="List quotas",
    responses={404: {"model": ErrorBody, "description": "no such tenant"}},
)
def list_quotas(
    caller: Annotated[Caller, requires(Scope.QUOTAS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    page: Annotated[Paging, Depends(paging)],
    tenant: Annotated[Label | None, Query(description="Only this tenant.")] = None,
) -> Page[QuotaOut]:
    shown = listed_tenants(caller, Scope.QUOTAS_READ, tenant, alloc)
    quotas = [convert.quota_out(q) for q in alloc.quotas() if shown is None or q.tenant in shown]
    return page.page(quotas)


@router.get(
    "/tenants/{tenant}/quotas/{flavor:path}",
    response_model=QuotaOut,
    responses=_404,
    summary="Read a quota",
)
def get_quota(
    tenant: TenantName,
    flavor: FlavorName,
    response: Response,
    caller: Annotated[Caller, requires(Scope.QUOTAS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
) -> QuotaOut:
    caller.require(Scope.QUOTAS_READ, tenant)
    for q in alloc.quotas(tenant):
        if q.flavor == flavor:
            response.headers["ETag"] = etag(q.version)
            return convert.quota_out(q)
    raise NotFound("quota", f"{tenant}/{flavor}")


@router.put(
    "/tenants/{tenant}/quotas/{flavor:path}",
    response_model=QuotaOut,
    responses=_EDIT,
    summary="Set a quota",
    description=(
        "Tenant admins set `guaranteed` and `limit` within the ceilings a platform admin "
        "(`custom:gpuportal:admin`) set for the tenant and flavor; only platform admins set "
        "the ceilings. Raising `guaranteed` so that the flavor's guarantees add up to more "
        "than its capacity is 422 unless a platform admin sends `overcommit: true`."
    ),
)
def put_quota(
    tenant: TenantName,
    flavor: FlavorName,
    body: QuotaIn,
    response: Response,
    caller: Annotated[Caller, requires(Scope.QUOTAS_WRITE)],
    alloc: Annotated[Allocator, Depends(allocator)],
    if_match: Annotated[str | None, Header(description='The ETag read, e.g. "3".')] = None,
    if_none_match: Annotated[str | None, Header(description="`*`: create only.")] = None,
) -> QuotaOut:
    caller.require(Scope.QUOTAS_WRITE, tenant)
    expected = expected_version(if_match, if_none_match)
    canonical = _offered_flavor(alloc, tenant, flavor)
    # Guarantees are the platform's to give: anyone else edits within the ceilings.
    platform = caller.can_everywhere(Scope.ADMIN)
    if body.overcommit and not platform:
        raise Forbidden(f"only a platform admin ({Scope.ADMIN}) may over-commit {tenant}/{flavor}")
    try:
        rec = alloc.set_quota(
            tenant,
            flavor,
            guaranteed=body.guaranteed,
            limit=body.limit,
            budget_gpu_hours=body.budget_gpu_hours,
            ceiling_guaranteed=body.ceiling_guaranteed,
            ceiling_limit=body.ceiling_limit,
            overcommit=platform and body.overcommit,
            within_ceiling=not platform,
            expected_version=expected,
        )
    except Conflict as exc:
        current = next((q.version for q in alloc.quotas(tenant) if q.flavor == canonical), None)
        raise refused_edit("quota", f"{tenant}/{canonical}", expected, current, exc) from exc
    response.headers["ETag"] = etag(rec.version)
    return convert.quota_out(rec)
