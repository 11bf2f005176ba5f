"""``/api/v1/ray``: Ray clusters per tenant — create, read, scale, resume, delete.

A Ray cluster is charged to a tenant like a workload, and guarded the same way: creating,
scaling and deleting need ``workloads:write`` on the tenant (and, for users, membership of
it), reading needs ``workloads:read`` on it; another tenant's token gets 403.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import Field

from policies.errors import Forbidden, InvalidRequest
from policies.ray import RayState, SliceState
from policies.requests import MAX_GANG_SIZE, MAX_PRIORITY, TopologyRequirement
from portal.accounting.service import Accounting
from portal.accounting.workloads import WorkloadCosts, workload_costs
from portal.allocator import Allocator
from portal.api import convert
from portal.api.auth import Caller, CallerKind, Scope
from portal.api.cost import MONEY, accounting_of, money_text, utc_param
from portal.api.deps import Paging, allocator, listed_tenants, paging, requires
from portal.api.errors import ERROR_RESPONSES, Responses
from portal.api.inputs import GENERATED_ID, KEY, Label, Text, bounded
from portal.api.schemas import DevicesIn, ErrorBody, InModel, Model, Page, WorkloadOut
from portal.api.workloads import charge
from portal.ray.controller import RayController, RayView, SliceView
from portal.ray.spec import MAX_CPUS, MAX_IDLE_S, RaySpec, worker_devices
from portal.ray.tokens import RayTokens
from portal.store import ray as stored
from portal.store.records import RayClusterRecord, RaySliceRecord

router = APIRouter(prefix="/ray", tags=["ray"], responses=ERROR_RESPONSES)

ClusterId = Annotated[
    Annotated[str, GENERATED_ID], Path(description="The cluster's id (as its creation answered).")
]
_404: Responses = {404: {"model": ErrorBody, "description": "no such Ray cluster or tenant"}}


def controller(request: Request) -> RayController:
    found: RayController = request.app.state.ray
    return found


def tokens(request: Request) -> RayTokens | None:
    """The clusters' tokens where the heads want one (Kubernetes); None: no authentication."""
    found: RayTokens | None = getattr(request.app.state, "ray_tokens", None)
    return found


# ------------------------------------------------------------------ bodies


class HeadIn(InModel):
    cpus: int = Field(default=1, ge=1, le=MAX_CPUS, description="The head's CPUs; it holds no GPU.")


class WorkersIn(InModel):
    devices: DevicesIn = Field(description="What each worker holds: one of the tenant's flavors.")
    min: int = Field(
        default=1,
        ge=0,
        le=MAX_GANG_SIZE,
        description="Workers admitted with the head as one gang, and never released below.",
    )
    max: int = Field(default=1, ge=1, le=MAX_GANG_SIZE, description="The most workers; >= min.")
    replicas: int | None = Field(
        default=None,
        ge=0,
        le=MAX_GANG_SIZE,
        description="Workers wanted now (min..max); null: min. Above min, a slice of its own.",
    )
    cpus: int = Field(default=1, ge=1, le=MAX_CPUS, description="Each worker's CPUs.")
    autoscale: bool = Field(
        default=False,
        description=(
            "Grow on demand: GPU tasks, actors or placement groups Ray cannot schedule ask "
            "for more workers (up to max), each increase a slice of its own. Needs max > min."
        ),
    )


class RayIn(InModel):
    tenant: Label = Field(description="The tenant charged; the caller must be a member of it.")
    name: Text = Field(description="A name for people.")
    head: HeadIn = Field(default_factory=HeadIn, description="The head (CPU only).")
    workers: WorkersIn = Field(description="The worker group.")
    ray_version: Annotated[str, bounded(KEY, 64)] | None = Field(
        default=None, description="The Ray version; only the installed one runs. null: it."
    )
    idle_s: float | None = Field(
        default=None,
        gt=0,
        le=MAX_IDLE_S,
        description=(
            "Seconds with no Ray task or actor on any node after which the workers are "
            "released (quota and devices free, the head kept: state idle). null: never."
        ),
    )
    idle_suspend: bool = Field(
        default=False,
        description="When idle, stop the head too and release everything (state suspended).",
    )
    priority: int = Field(
        default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY, description="Within the tenant's quota."
    )


class ScaleIn(InModel):
    workers: int = Field(ge=0, le=MAX_GANG_SIZE, description="Workers wanted (min..max).")


class SliceOut(Model):
    number: int = Field(ge=1, description="1: the gang admitted with the head.")
    workers: int = Field(ge=1)
    state: SliceState = Field(description="queued, running or released.")
    reason: str = Field(description="Why it was released; '' otherwise.")
    requested_at: datetime
    started_at: datetime | None
    released_at: datetime | None
    workload: WorkloadOut | None = Field(
        description="Its allocator workload: reason and position while queued; null once released."
    )


class RayOut(Model):
    id: str
    tenant: str
    owner: str
    name: str
    state: RayState = Field(
        description="queued, starting, running, idle (workers released), suspended or stopped."
    )
    message: str = Field(description="Where it stands, as a sentence.")
    address: str | None = Field(description="The head's host:port for ray.init; null before.")
    workers: int = Field(ge=0, description="Workers wanted now.")
    joined: int = Field(ge=0, description="Workers running and joined to the head.")
    min_workers: int = Field(ge=0)
    max_workers: int = Field(ge=1)
    ray_version: str
    created_at: datetime
    updated_at: datetime
    ended_at: datetime | None
    spec: dict[str, Any] = Field(description="The cluster as asked for (defaults filled in).")
    slices: list[SliceOut] = Field(description="Its slices, oldest first.")


class SliceCostOut(Model):
    number: int = Field(ge=1, description="1: the gang admitted with the head.")
    workers: int = Field(ge=1)
    state: SliceState = Field(description="queued, running or released.")
    workload_id: str = Field(description="Its allocator workload, whose allocations are priced.")
    gpu_hours: float = Field(ge=0, description="GPU-equivalent hours it held (running: to now).")
    cost: str = Field(pattern=MONEY, description="In `currency`, whole cents.")


class RayCostOut(Model):
    cluster_id: str
    tenant: str = Field(description="The tenant charged.")
    currency: str
    unpriced_models: list[str] = Field(
        description="GPU models its workers held without a configured price; counted at 0."
    )
    gpu_hours: float = Field(ge=0, description="Every slice together, since it was created.")
    cost: str = Field(
        pattern=MONEY,
        description="Every slice together, rounded once from the exact sum (whole cents).",
    )
    slices: list[SliceCostOut] = Field(description="Each slice, oldest first.")


class RayTokenOut(Model):
    cluster_id: str
    auth_mode: Literal["token", "none"] = Field(
        description="token: the head wants `token` (Ray's RAY_AUTH_MODE); none: no token."
    )
    token: str | None = Field(
        description=(
            "The cluster's Ray token: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN to it before "
            "ray.init. null where the heads run without authentication (the local backend)."
        )
    )


def slice_out(v: SliceView) -> SliceOut:
    s = v.slice
    return SliceOut(
        number=s.number,
        workers=s.workers,
        state=s.state,
        reason=s.reason,
        requested_at=s.requested_at,
        started_at=s.started_at,
        released_at=s.released_at,
        workload=convert.workload_out(v.workload) if v.workload is not None else None,
    )


def ray_out(v: RayView) -> RayOut:
    c = v.cluster
    spec = c.spec
    return RayOut(
        id=c.id,
        tenant=c.tenant,
        owner=c.owner,
        name=c.name,
        state=c.state,
        message=c.message,
        address=c.address,
        workers=int(spec["workers"]),  # type: ignore[call-overload]
        joined=v.joined,
        min_workers=int(spec["min_workers"]),  # type: ignore[call-overload]
        max_workers=int(spec["max_workers"]),  # type: ignore[call-overload]
        ray_version=str(spec["ray_version"]),
        created_at=c.created_at,
        updated_at=c.updated_at,
        ended_at=c.ended_at,
        spec=spec,
        slices=[slice_out(s) for s in v.slices],
    )


def spec_of(body: RayIn, owner: str, installed: str | None) -> RaySpec:
    """The cluster a body describes; rules across fields raise ``InvalidRequest`` naming one."""
    w = body.workers
    if w.devices.topology is not TopologyRequirement.ANY:
        raise InvalidRequest("workers.devices.topology", w.devices.topology.value, "any")
    return RaySpec(
        tenant=body.tenant,
        owner=owner,
        name=body.name,
        devices=worker_devices(w.devices.model_dump(mode="json")),
        min_workers=w.min,
        max_workers=w.max,
        workers=w.min if w.replicas is None else w.replicas,
        ray_version=body.ray_version or installed or "",
        head_cpus=body.head.cpus,
        worker_cpus=w.cpus,
        idle_s=body.idle_s,
        priority=body.priority,
        idle_suspend=body.idle_suspend,
        autoscale=w.autoscale,
    )


# ------------------------------------------------------------------ routes


@router.post("", response_model=RayOut, status_code=201, responses=_404, summary="Create one")
def create_cluster(
    body: RayIn,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    rays: Annotated[RayController, Depends(controller)],
) -> RayOut:
    """Created with its slices requested: see each slice's `workload` for its queue reason,
    and `state`/`address` for when the head is up and the workers have joined."""
    charge(caller, body.tenant)
    return ray_out(rays.create(spec_of(body, caller.name, rays.installed)))


@router.get(
    "",
    response_model=Page[RayOut],
    responses={404: {"model": ErrorBody, "description": "no such tenant"}},
    summary="List Ray clusters",
)
def list_clusters(
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    rays: Annotated[RayController, Depends(controller)],
    page: Annotated[Paging, Depends(paging)],
    tenant: Annotated[Label | None, Query(description="Only this tenant.")] = None,
    state: Annotated[RayState | None, Query(description="Only this state.")] = None,
) -> Page[RayOut]:
    """Every cluster the caller may see, in creation order, stopped ones included."""
    shown = listed_tenants(caller, Scope.WORKLOADS_READ, tenant, alloc)
    views = [v for v in rays.clusters(shown) if state is None or v.cluster.state is state]
    return page.page_of(views, ray_out)


@router.get(
    "/costs",
    response_model=Page[RayCostOut],
    responses={404: {"model": ErrorBody, "description": "no such tenant"}},
    summary="Every visible cluster's GPU-hours and money since creation, in one read",
)
def list_costs(
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    rays: Annotated[RayController, Depends(controller)],
    acc: Annotated[Accounting, Depends(accounting_of)],
    page: Annotated[Paging, Depends(paging)],
    tenant: Annotated[Label | None, Query(description="Only this tenant.")] = None,
    ended_since: Annotated[
        datetime | None,
        Query(description="Stopped clusters only if they ended at or after this time (UTC)."),
    ] = None,
) -> Page[RayCostOut]:
    """What `/ray/{id}/cost` answers for each cluster the caller may read (the list's
    order), priced in one accounting read: a dashboard line per cluster costs one request,
    not one per cluster."""
    shown = listed_tenants(caller, Scope.WORKLOADS_READ, tenant, alloc)
    since = None if ended_since is None else utc_param("ended_since", ended_since)
    clusters = [
        c
        for c in stored.clusters(rays.store, tenants=shown)
        if c.state is not RayState.STOPPED
        or since is None
        or (c.ended_at is not None and c.ended_at >= since)
    ]
    chunk = page.page(clusters)
    slices = stored.slices_of(rays.store, [c.id for c in chunk.items])
    costs = workload_costs(acc, [s.workload_id for v in slices.values() for s in v])
    return Page[RayCostOut](
        items=[cost_out(c, slices.get(c.id, []), costs) for c in chunk.items],
        total=chunk.total,
        limit=chunk.limit,
        offset=chunk.offset,
        next_offset=chunk.next_offset,
    )


@router.get("/{cluster_id}", response_model=RayOut, responses=_404, summary="Read one")
def get_cluster(
    cluster_id: ClusterId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    rays: Annotated[RayController, Depends(controller)],
) -> RayOut:
    view = rays.view(cluster_id)
    caller.require(Scope.WORKLOADS_READ, view.cluster.tenant)
    return ray_out(view)


@router.get(
    "/{cluster_id}/token",
    response_model=RayTokenOut,
    responses=_404,
    summary="Its Ray token, for ray.init from a notebook: its owner and the tenant's admins only",
)
def cluster_token(
    cluster_id: ClusterId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    rays: Annotated[RayController, Depends(controller)],
    keys: Annotated[RayTokens | None, Depends(tokens)],
) -> RayTokenOut:
    """Whoever holds the token can run anything on the cluster, so reading the cluster is not
    enough: another member of the tenant gets 403, as does another tenant's token."""
    cluster = rays.get(cluster_id)
    charge(caller, cluster.tenant)  # a member of the tenant (or a platform admin)
    owner = caller.kind is CallerKind.USER and caller.name == cluster.owner
    # The tenant's admins are those who may change its quotas (as for its alerts).
    if not owner and not caller.can(Scope.QUOTAS_WRITE, cluster.tenant):
        raise Forbidden(
            f"{caller.kind} {caller.name} may not read the token of Ray cluster {cluster_id}: "
            f"only its owner ({cluster.owner}) and tenant {cluster.tenant}'s admins may"
        )
    if keys is None:
        return RayTokenOut(cluster_id=cluster.id, auth_mode="none", token=None)
    return RayTokenOut(cluster_id=cluster.id, auth_mode="token", token=keys.token(cluster.id))


def cost_out(
    cluster: RayClusterRecord, slices: Sequence[RaySliceRecord], costs: WorkloadCosts
) -> RayCostOut:
    costs = costs.subset([s.workload_id for s in slices])
    total = costs.total()
    return RayCostOut(
        cluster_id=cluster.id,
        tenant=cluster.tenant,
        currency=costs.currency,
        unpriced_models=list(costs.unpriced_models),
        gpu_hours=float(total.allocated_gpu_hours),
        cost=money_text(total.cost),
        slices=[
            SliceCostOut(
                number=s.number,
                workers=s.workers,
                state=s.state,
                workload_id=s.workload_id,
                gpu_hours=float(costs.of(s.workload_id).allocated_gpu_hours),
                cost=money_text(costs.of(s.workload_id).cost),
            )
            for s in slices
        ],
    )


@router.get(
    "/{cluster_id}/cost",
    response_model=RayCostOut,
    responses=_404,
    summary="Its GPU-hours and money since creation: every slice, priced as /cost prices",
)
def cluster_cost(
    cluster_id: ClusterId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    rays: Annotated[RayController, Depends(controller)],
    acc: Annotated[Accounting, Depends(accounting_of)],
) -> RayCostOut:
    """Each slice is an allocator workload, charged as any (its hours are in the tenant's
    `/cost` totals too); a released slice keeps what it cost."""
    cluster = rays.get(cluster_id)
    caller.require(Scope.WORKLOADS_READ, cluster.tenant)
    slices = stored.slices(rays.store, cluster_id)
    return cost_out(cluster, slices, workload_costs(acc, [s.workload_id for s in slices]))


@router.patch(
    "/{cluster_id}",
    response_model=RayOut,
    responses=_404,
    summary="Scale: an increase is a new charged slice, a decrease releases slices",
)
def scale_cluster(
    cluster_id: ClusterId,
    body: ScaleIn,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    rays: Annotated[RayController, Depends(controller)],
) -> RayOut:
    charge(caller, rays.get(cluster_id).tenant)
    return ray_out(rays.scale(cluster_id, body.workers))


@router.post(
    "/{cluster_id}/resume",
    response_model=RayOut,
    responses={
        **_404,
        409: {"model": ErrorBody, "description": "the cluster is not idle or suspended"},
    },
    summary="Resume an idle or suspended cluster: its previous size goes through admission",
)
def resume_cluster(
    cluster_id: ClusterId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    rays: Annotated[RayController, Depends(controller)],
) -> RayOut:
    """Its slices are requested again as at creation and may wait in the queue with their
    reason; a suspended cluster's head starts again at a new address."""
    charge(caller, rays.get(cluster_id).tenant)
    return ray_out(rays.resume(cluster_id))


@router.delete(
    "/{cluster_id}",
    response_model=RayOut,
    responses=_404,
    summary="Delete: stop every node and release every slice (idempotent)",
)
def delete_cluster(
    cluster_id: ClusterId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    rays: Annotated[RayController, Depends(controller)],
) -> RayOut:
    charge(caller, rays.get(cluster_id).tenant)
    return ray_out(rays.delete(cluster_id))
