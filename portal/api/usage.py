"""``/api/v1/usage``: guaranteed, limit, used, borrowed and lent per tenant and flavor."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from portal.allocator import Allocator
from portal.api import convert
from portal.api.auth import Caller, Scope
from portal.api.deps import Paging, allocator, listed_tenants, paging, requires
from portal.api.errors import ERROR_RESPONSES
from portal.api.inputs import Label
from portal.api.schemas import ErrorBody, Page, UsageOut

router = APIRouter(prefix="/usage", tags=["usage"], responses=ERROR_RESPONSES)


@router.get(
    "",
    response_model=Page[UsageOut],
    responses={404: {"model": ErrorBody, "description": "no such tenant"}},
    summary="Quota usage",
)
def list_usage(
    caller: Annotated[Caller, requires(Scope.USAGE_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    page: Annotated[Paging, Depends(paging)],
    tenant: Annotated[Label | None, Query(description="Only this tenant.")] = None,
) -> Page[UsageOut]:
    shown = listed_tenants(caller, Scope.USAGE_READ, tenant, alloc)
    names = [t.name for t in alloc.tenants()] if shown is None else sorted(shown)
    if tenant is None:
        known = {t.name for t in alloc.tenants()}
        names = [n for n in names if n in known]
    rows = [convert.usage_out(t, u) for t in names for u in alloc.usage(t)]
    return page.page(rows)
