"""``/api/v1/queue``: pending workloads in scheduling order, each with its reason."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query

from portal.allocator import Allocator
from portal.api import convert
from portal.api.auth import Caller, Scope
from portal.api.deps import Paging, allocator, listed_tenants, paging, requires
from portal.api.errors import ERROR_RESPONSES
from portal.api.inputs import Label
from portal.api.schemas import ErrorBody, Page, QueueEntryOut

router = APIRouter(prefix="/queue", tags=["queue"], responses=ERROR_RESPONSES)


@router.get(
    "",
    response_model=Page[QueueEntryOut],
    summary="The queue",
    responses={404: {"model": ErrorBody, "description": "no such tenant"}},
)
def list_queue(
    caller: Annotated[Caller, requires(Scope.QUEUE_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    page: Annotated[Paging, Depends(paging)],
    tenant: Annotated[Label | None, Query(description="Only this tenant.")] = None,
) -> Page[QueueEntryOut]:
    shown = listed_tenants(caller, Scope.QUEUE_READ, tenant, alloc)
    entries = [
        convert.queue_entry_out(e) for e in alloc.queue() if shown is None or e.tenant in shown
    ]
    return page.page(entries)
