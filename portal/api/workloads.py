"""``/api/v1/workloads``: request GPUs (allocated now or queued), read, release."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Path, Query, Response

from policies.errors import Forbidden
from policies.requests import DeviceRequest, WorkloadKind, WorkloadRequest
from portal.allocator import Allocator, codec
from portal.api import convert
from portal.api.auth import Caller, CallerKind, Scope
from portal.api.deps import Paging, allocator, listed_tenants, paging, requires
from portal.api.errors import ERROR_RESPONSES, Responses, shown_value
from portal.api.inputs import HEADER, KEY, TEXT, Label, bounded
from portal.api.prestart import prestart_of
from portal.api.schemas import ErrorBody, Page, WorkloadIn, WorkloadOut
from portal.errors import IdempotencyMismatch
from portal.prestart.service import PrestartService
from portal.store.records import WorkloadState

router = APIRouter(prefix="/workloads", tags=["workloads"], responses=ERROR_RESPONSES)

WorkloadId = Annotated[Annotated[str, bounded(KEY, 64)], Path(description="The workload's id.")]
_404: Responses = {404: {"model": ErrorBody, "description": "no such workload or tenant"}}


def charge(caller: Caller, tenant: str) -> None:
    """May ``caller`` spend ``tenant``'s quota? Users must also be members of it."""
    caller.require(Scope.WORKLOADS_WRITE, tenant)
    if (
        caller.kind is CallerKind.USER
        and tenant not in caller.groups
        and not caller.can(Scope.ADMIN, tenant)
    ):
        raise Forbidden(
            f"user {caller.name} is not a member of tenant {tenant}; "
            f"their tenants: {', '.join(sorted(caller.groups)) or 'none'}"
        )


def _check_retry(
    alloc: Allocator,
    workload_id: str,
    req: WorkloadRequest,
    expected_duration_s: float | None,
    key: str,
) -> None:
    """Refuse a retry whose body differs from the first request with its key, as Stripe does:
    answering the first workload to a different request would hide a client's bug (a key
    reused across spawns). Compared after ``request``, on the record the allocator stored:
    a first request with the key stored exactly this request, so only a mismatching retry
    differs, and the allocator created nothing for it, however requests race."""
    first = alloc.store.workload(workload_id)
    if first is None:
        return
    asked = {
        "name": req.name,
        "kind": req.kind.value,
        "devices": codec.device_request_to_dict(req.devices),
        "gang_size": req.gang_size,
        "priority": req.priority,
        "expected_duration_s": expected_duration_s,
    }
    stored = {
        "name": first.name,
        "kind": first.kind,
        "devices": first.request,
        "gang_size": first.gang_size,
        "priority": first.priority,
        "expected_duration_s": first.expected_duration_s,
    }
    differing = [k for k in asked if asked[k] != stored[k]]
    if differing:
        raise IdempotencyMismatch(
            "Idempotency-Key",
            shown_value(key),
            f"a new key for a different request: workload {workload_id} was requested with "
            f"this key and another {', '.join(differing)}",
        )


@router.post(
    "",
    response_model=WorkloadOut,
    status_code=201,
    responses={
        **_404,
        202: {"model": WorkloadOut, "description": "queued: see reason, position and eta_s"},
    },
    summary="Request GPUs for a workload",
)
def request_workload(
    body: WorkloadIn,
    response: Response,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    alloc: Annotated[Allocator, Depends(allocator)],
    pre: Annotated[PrestartService | None, Depends(prestart_of)],
    idempotency_key: Annotated[
        Annotated[str, HEADER] | None,
        Header(
            description="Retries with the same key (per tenant and owner) allocate once.",
        ),
    ] = None,
    owner: Annotated[
        Annotated[str, bounded(TEXT, 255)] | None,
        Query(
            description=(
                "Services only (e.g. the hub's spawner): the user the workload is for, who "
                "becomes its owner; the service vouches for the user's membership. "
                "Default: the caller."
            ),
        ),
    ] = None,
) -> WorkloadOut:
    """201 with allocations when it runs now; 202 with a reason and position when queued."""
    charge(caller, body.tenant)
    if owner is not None and caller.kind is not CallerKind.SERVICE:
        raise Forbidden(
            f"{caller.kind} {caller.name} may not request on behalf of {owner}: "
            "only services (such as the hub's spawner) may set owner"
        )
    d = body.devices
    req = WorkloadRequest(
        tenant=body.tenant,
        owner=owner or caller.name,
        name=body.name,
        devices=DeviceRequest(
            kind=d.kind,
            count=d.count,
            models=frozenset(d.models),
            mig_profile=d.mig_profile,
            milli=d.milli,
            gpu_memory_mib=d.gpu_memory_mib,
            cpu_milli=d.cpu_milli,
            memory_mib=d.memory_mib,
            topology=d.topology,
        ),
        kind=body.kind,
        gang_size=body.gang_size,
        priority=body.priority,
    )
    # A spawn of an option with a pre-started placeholder takes its devices in one decision.
    adopt = None
    if pre is not None and body.option is not None and req.kind is WorkloadKind.NOTEBOOK:
        adopt = pre.placeholder_for(body.option, req.devices) if req.gang_size == 1 else None
    status = alloc.request(
        req,
        idempotency_key=idempotency_key,
        expected_duration_s=body.expected_duration_s,
        adopt=adopt,
    )
    if idempotency_key is not None:
        _check_retry(alloc, status.id, req, body.expected_duration_s, idempotency_key)
    response.status_code = 202 if status.state is WorkloadState.QUEUED else 201
    return convert.workload_out(status)


@router.get(
    "",
    response_model=Page[WorkloadOut],
    summary="List live workloads",
    responses={404: {"model": ErrorBody, "description": "no such tenant"}},
)
def list_workloads(
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    page: Annotated[Paging, Depends(paging)],
    tenant: Annotated[Label | None, Query(description="Only this tenant.")] = None,
    state: Annotated[WorkloadState | None, Query(description="Only this state.")] = None,
) -> Page[WorkloadOut]:
    """Queued, running and preempting workloads in arrival order; ended ones by id only."""
    shown = listed_tenants(caller, Scope.WORKLOADS_READ, tenant, alloc)
    items = [
        convert.workload_out(s)
        for s in alloc.workloads()
        if (shown is None or s.tenant in shown) and (state is None or s.state is state)
    ]
    return page.page(items)


@router.get("/{workload_id}", response_model=WorkloadOut, responses=_404, summary="Read one")
def get_workload(
    workload_id: WorkloadId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
) -> WorkloadOut:
    status = alloc.status(workload_id)
    caller.require(Scope.WORKLOADS_READ, status.tenant)
    return convert.workload_out(status)


@router.delete(
    "/{workload_id}",
    response_model=WorkloadOut,
    responses=_404,
    summary="Release its devices, or leave the queue (idempotent)",
)
def release_workload(
    workload_id: WorkloadId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    alloc: Annotated[Allocator, Depends(allocator)],
) -> WorkloadOut:
    charge(caller, alloc.status(workload_id).tenant)
    return convert.workload_out(alloc.release(workload_id))
