"""``/api/v1/services``: inference services — deploy, read, scale, delete, their replicas,
events and logs.

Guarded like jobs: deploying, scaling and deleting need ``workloads:write`` on the tenant (and,
for users, membership of it), reading needs ``workloads:read`` on it; another tenant's token
gets 403. Calling a service goes through the gateway (``portal.inference.gateway``).
"""

from __future__ import annotations

import math
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import Field

from policies.errors import InvalidRequest
from policies.prewarm import WarmReason
from policies.requests import MAX_PRIORITY, TopologyRequirement
from policies.services import (
    MAX_IDLE_S,
    MAX_REPLICAS,
    MAX_WINDOW_S,
    ModelRef,
    Replicas,
    ReplicaState,
    ScalingMetric,
    ScalingRule,
    ServiceState,
    WarmPolicy,
)
from portal.allocator import Allocator
from portal.api import convert
from portal.api.auth import Caller, Scope
from portal.api.deps import Paging, allocator, listed_tenants, paging, requires
from portal.api.errors import ERROR_RESPONSES, Responses
from portal.api.inputs import GENERATED_ID, KEY, Label, StringRule, bounded
from portal.api.jobs import ARG, ENV_NAME, ENV_VALUE
from portal.api.schemas import DevicesIn, ErrorBody, InModel, Model, Page, WorkloadOut
from portal.api.workloads import charge
from portal.inference.cached import listing
from portal.inference.controller import ServiceController, ServiceView
from portal.inference.spec import MAX_ARGS, Engine, Hold, Preset, ServiceSpec
from portal.inference.traffic import Traffic
from portal.inference.weights import CacheEntry
from portal.jobs.spec import device_request
from portal.store.records import EventRecord, ReplicaRecord

router = APIRouter(prefix="/services", tags=["services"], responses=ERROR_RESPONSES)

# The ids the portal makes: ``/services/cache`` can never be read as a service's.
ServiceId = Annotated[
    Annotated[str, GENERATED_ID], Path(description="The service's id (as its deploy answered).")
]
_404: Responses = {404: {"model": ErrorBody, "description": "no such service or tenant"}}
MAX_LOG_BYTES = 1 << 20
NAME = StringRule(
    r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
    63,
    "a DNS label: lowercase letters, digits and '-' (it is the model's id and a URL part)",
)
URL_PATH = StringRule(r"^/[!-~]*$", 1024, "a path starting with /")


def services(request: Request) -> ServiceController:
    controller: ServiceController = request.app.state.services
    return controller


# ------------------------------------------------------------------ bodies


class EngineIn(InModel):
    preset: Preset = Field(
        default=Preset.VLLM,
        strict=False,
        description="vllm, sglang, tgi, test (the project's test engine) or custom.",
    )
    args: list[Annotated[str, ARG]] = Field(
        default_factory=list, max_length=MAX_ARGS, description="Added after the preset's."
    )
    command: list[Annotated[str, ARG]] = Field(
        default_factory=list,
        max_length=MAX_ARGS,
        description="custom only: the program and arguments; {port}, {host}, {model}, {name}.",
    )
    image: Annotated[str, bounded(KEY, 1024)] | None = Field(
        default=None, description="Kubernetes: the image; null: the preset's."
    )
    health_path: Annotated[str, URL_PATH] | None = Field(default=None, description="null: preset's")
    metrics_path: Annotated[str, URL_PATH] | None = Field(
        default=None, description="null: preset's"
    )
    env: dict[Annotated[str, ENV_NAME], Annotated[str, ENV_VALUE]] = Field(
        default_factory=dict, max_length=256, description="Extra variables of the engine."
    )


class ModelIn(InModel):
    uri: Annotated[str, StringRule(r"^\S+$", 4096, "a URI without spaces")] = Field(
        description="file:///folder, https://..., s3://bucket/key, gs://bucket/key, hf://org/name"
    )
    digest: Annotated[str, StringRule(r"^\S+$", 80, "sha256:<64 hex digits>")] = Field(
        description="sha256:<64 lowercase hex digits> of the model's files."
    )


class ReplicasIn(InModel):
    min: int = Field(default=1, ge=0, le=MAX_REPLICAS, description="0 allows scale-to-zero.")
    max: int = Field(default=1, ge=1, le=MAX_REPLICAS, description=">= min.")
    warm: int = Field(
        default=0,
        ge=0,
        le=MAX_REPLICAS,
        description="Kept started and asleep beside the serving ones; <= max.",
    )


class ScalingIn(InModel):
    metric: ScalingMetric = Field(default=ScalingMetric.WAITING_REQUESTS, strict=False)
    target: float = Field(default=4.0, gt=0, le=1e6, description="Per replica.")
    up_window_s: float = Field(default=5.0, ge=0, le=MAX_WINDOW_S)
    down_window_s: float = Field(default=300.0, ge=0, le=MAX_WINDOW_S)
    idle_s: float = Field(
        default=600.0, gt=0, le=MAX_IDLE_S, description="No request this long: 0 (if min 0)."
    )
    warm_policy: WarmPolicy = Field(
        default=WarmPolicy.FIXED,
        strict=False,
        description=(
            "fixed: replicas.warm kept warm; forecast: replicas.warm is the budget of the "
            "pre-warm planner (the reactive floor, 0, while its forecast is not trusted)."
        ),
    )


class HoldIn(InModel):
    max_requests: int = Field(default=100, ge=0, le=100_000, description="Held at once.")
    timeout_s: float = Field(default=600.0, gt=0, le=3600, description="Each at most this long.")


class ServiceIn(InModel):
    tenant: Label = Field(description="The tenant charged; the caller must be a member of it.")
    name: Annotated[str, NAME] = Field(description="Unique in the tenant; the model's id.")
    engine: EngineIn = Field(default_factory=EngineIn)
    model: ModelIn
    devices: DevicesIn = Field(description="What each replica needs: gpu, mig or share.")
    replicas: ReplicasIn = Field(default_factory=ReplicasIn)
    scaling: ScalingIn = Field(default_factory=ScalingIn)
    hold: HoldIn = Field(default_factory=HoldIn, description="Requests held from zero.")
    priority: int = Field(default=0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)


class ServicePatch(InModel):
    replicas: ReplicasIn | None = Field(default=None, description="null: unchanged.")
    scaling: ScalingIn | None = Field(default=None, description="null: unchanged.")


class ReplicaOut(Model):
    number: int = Field(ge=1)
    state: ReplicaState = Field(description="queued, starting, ready, asleep, stopping, ended.")
    warm: bool = Field(description="Started for the warm pool (asleep until woken).")
    woken_at: datetime | None = Field(description="When it left the warm pool to serve.")
    workload_id: str
    node: str | None
    devices: list[str] = Field(description="Its CUDA_VISIBLE_DEVICES values.")
    port: int | None
    queued_at: datetime
    started_at: datetime | None
    ready_at: datetime | None
    ended_at: datetime | None
    reason: str = Field(description="Why it stopped or ended; '' while it serves.")
    workload: WorkloadOut | None = Field(
        default=None, description="Queue reason, position and ETA while queued."
    )


class WarmPlanOut(Model):
    """The pre-warm planner's latest size for a service with ``warm_policy: forecast``."""

    replicas: int = Field(ge=0, description="Warm replicas it keeps now.")
    reason: WarmReason = Field(
        description=(
            "forecast (sized from it), high-error (recent error above the limit: the "
            "reactive floor), no-error-yet (not checked yet: the floor), no-forecast."
        )
    )
    budget: int = Field(ge=0, description="replicas.warm: the most it may keep.")
    recent_error: float | None = Field(
        description="The forecast's MASE on its latest day of bins; null before it is checked."
    )
    method: str | None = Field(description="How the forecast was made; null before any.")
    at: datetime = Field(description="When it was planned.")


class ServiceOut(Model):
    id: str
    tenant: str
    owner: str
    name: str
    state: ServiceState = Field(description="active, failed, deleted.")
    message: str
    desired: int = Field(ge=0, description="Replicas it keeps now.")
    ready: int = Field(ge=0, description="Replicas serving.")
    asleep: int = Field(ge=0, description="Warm replicas asleep, woken before a cold start.")
    created_at: datetime
    updated_at: datetime
    last_request_at: datetime | None
    spec: dict[str, Any]
    replicas: list[ReplicaOut] = Field(description="Live replicas (not ended).")
    gateway: str = Field(description="The OpenAI base path, relative to the portal's root.")
    traffic: dict[str, float | int | None] = Field(
        description=(
            "The gateway's counts since the portal started: held (waiting for a ready "
            "replica), held_total (every request ever held), in_flight, served, refused "
            "(503), failed (replica unreachable), "
            "first_byte_p50_s and first_byte_p99_s (arrival to the replica's first byte)."
        )
    )
    warm_plan: WarmPlanOut | None = Field(
        default=None,
        description="With scaling.warm_policy forecast, the planner's latest size; else null.",
    )


class EventOut(Model):
    at: datetime
    kind: str
    message: str
    workload_id: str | None


class LogOut(Model):
    service_id: str
    replica: int = Field(ge=1)
    offset: int = Field(ge=0)
    next_offset: int = Field(ge=0)
    text: str


def replica_out(r: ReplicaRecord, workload: WorkloadOut | None = None) -> ReplicaOut:
    return ReplicaOut(
        number=r.number,
        state=r.state,
        workload_id=r.workload_id,
        node=r.node,
        devices=list(r.devices),
        port=r.port,
        queued_at=r.queued_at,
        started_at=r.started_at,
        ready_at=r.ready_at,
        ended_at=r.ended_at,
        reason=r.reason,
        warm=r.warm,
        woken_at=r.woken_at,
        workload=workload,
    )


def service_out(v: ServiceView, controller: ServiceController) -> ServiceOut:
    s = v.service
    traffic = controller.traffic.get(s.id) or Traffic()
    sizing = controller.warm_plans.get(s.id)
    return ServiceOut(
        id=s.id,
        tenant=s.tenant,
        owner=s.owner,
        name=s.name,
        state=s.state,
        message=s.message,
        desired=s.desired,
        ready=v.ready,
        asleep=sum(1 for r in v.replicas if r.replica.state is ReplicaState.ASLEEP),
        created_at=s.created_at,
        updated_at=s.updated_at,
        last_request_at=s.last_request_at,
        spec=s.spec,
        replicas=[
            replica_out(r.replica, convert.workload_out(r.workload) if r.workload else None)
            for r in v.replicas
        ],
        gateway=f"gateway/{s.tenant}/{s.name}/v1",
        traffic=traffic.summary(),
        warm_plan=None
        if sizing is None
        else WarmPlanOut(
            replicas=sizing.replicas,
            reason=sizing.reason,
            budget=sizing.budget,
            recent_error=None
            if sizing.recent_error is None or not math.isfinite(sizing.recent_error)
            else sizing.recent_error,
            method=sizing.method,
            at=sizing.at,
        ),
    )


def _replicas(body: ReplicasIn) -> Replicas:
    return Replicas(min=body.min, max=body.max, warm=body.warm)


def _scaling(body: ScalingIn) -> ScalingRule:
    return ScalingRule(**body.model_dump())


def spec_of(body: ServiceIn, owner: str) -> ServiceSpec:
    if body.devices.topology is not TopologyRequirement.ANY:
        raise InvalidRequest("devices.topology", body.devices.topology.value, "any")
    e = body.engine
    return ServiceSpec(
        tenant=body.tenant,
        owner=owner,
        name=body.name,
        engine=Engine(
            preset=e.preset,
            args=tuple(e.args),
            command=tuple(e.command),
            image=e.image,
            health_path=e.health_path,
            metrics_path=e.metrics_path,
            env=tuple(sorted(e.env.items())),
        ),
        model=ModelRef(body.model.uri, body.model.digest),
        devices=device_request(body.devices.model_dump(mode="json")),
        replicas=_replicas(body.replicas),
        scaling=_scaling(body.scaling),
        hold=Hold(body.hold.max_requests, body.hold.timeout_s),
        priority=body.priority,
    )


# ------------------------------------------------------------------ routes


@router.post(
    "", response_model=ServiceOut, status_code=201, responses=_404, summary="Deploy a service"
)
def deploy_service(
    body: ServiceIn,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    controller: Annotated[ServiceController, Depends(services)],
) -> ServiceOut:
    """Created with its first replicas requested: see each replica's `workload` for its
    queue reason, position and ETA."""
    charge(caller, body.tenant)
    return service_out(controller.deploy(spec_of(body, caller.name)), controller)


@router.get(
    "",
    response_model=Page[ServiceOut],
    responses={404: {"model": ErrorBody, "description": "no such tenant"}},
    summary="List services",
)
def list_services(
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    controller: Annotated[ServiceController, Depends(services)],
    page: Annotated[Paging, Depends(paging)],
    tenant: Annotated[Label | None, Query(description="Only this tenant.")] = None,
    state: Annotated[ServiceState | None, Query(description="Only this state.")] = None,
) -> Page[ServiceOut]:
    shown = listed_tenants(caller, Scope.WORKLOADS_READ, tenant, alloc)
    views = [v for v in controller.services(shown) if state is None or v.service.state is state]
    return page.page_of(views, lambda v: service_out(v, controller))


class CacheEntryOut(Model):
    """One tenant's use of one model in one node's weight cache."""

    node: str
    tenant: str
    digest: str = Field(description="sha256:<hex> of the model's files: the entry's address.")
    size_bytes: int = Field(ge=0, description="Counted in full against each tenant that uses it.")
    last_used: datetime = Field(description="When a replica of this tenant last started on it.")
    in_use: bool = Field(description="A running replica uses it: it is never evicted.")


@router.get(
    "/cache",
    response_model=Page[CacheEntryOut],
    responses={404: {"model": ErrorBody, "description": "no such tenant"}},
    summary="List the weight cache's entries per node and tenant",
)
def list_weight_cache(
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    alloc: Annotated[Allocator, Depends(allocator)],
    controller: Annotated[ServiceController, Depends(services)],
    page: Annotated[Paging, Depends(paging)],
    tenant: Annotated[Label | None, Query(description="Only this tenant.")] = None,
    node: Annotated[Label | None, Query(description="Only this node.")] = None,
) -> Page[CacheEntryOut]:
    """The caller's tenants' entries (every tenant's for the platform admin); empty where
    services run without a weight cache."""
    shown = listed_tenants(caller, Scope.WORKLOADS_READ, tenant, alloc)
    rows = listing(controller.backend, controller.store, shown)
    rows = [e for e in rows if node is None or e.node == node]
    return page.page_of(rows, _cache_entry_out)


def _cache_entry_out(e: CacheEntry) -> CacheEntryOut:
    return CacheEntryOut(
        node=e.node,
        tenant=e.tenant,
        digest=e.digest,
        size_bytes=e.size,
        last_used=e.last_used,
        in_use=e.in_use,
    )


def _readable(caller: Caller, controller: ServiceController, service_id: str) -> ServiceView:
    view = controller.view(service_id)
    caller.require(Scope.WORKLOADS_READ, view.service.tenant)
    return view


@router.get("/{service_id}", response_model=ServiceOut, responses=_404, summary="Read one")
def get_service(
    service_id: ServiceId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    controller: Annotated[ServiceController, Depends(services)],
) -> ServiceOut:
    return service_out(_readable(caller, controller, service_id), controller)


@router.patch(
    "/{service_id}",
    response_model=ServiceOut,
    responses=_404,
    summary="Change its replica bounds or scaling rule",
)
def scale_service(
    service_id: ServiceId,
    body: ServicePatch,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    controller: Annotated[ServiceController, Depends(services)],
) -> ServiceOut:
    charge(caller, controller.get(service_id).tenant)
    view = controller.scale(
        service_id,
        replicas=_replicas(body.replicas) if body.replicas else None,
        scaling=_scaling(body.scaling) if body.scaling else None,
    )
    return service_out(view, controller)


@router.delete(
    "/{service_id}",
    response_model=ServiceOut,
    responses=_404,
    summary="Delete: stop its replicas and release their devices (idempotent)",
)
def delete_service(
    service_id: ServiceId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_WRITE)],
    controller: Annotated[ServiceController, Depends(services)],
) -> ServiceOut:
    charge(caller, controller.get(service_id).tenant)
    return service_out(controller.delete(service_id), controller)


@router.get(
    "/{service_id}/replicas",
    response_model=Page[ReplicaOut],
    responses=_404,
    summary="Every replica it had, ended ones included, oldest first",
)
def service_replicas(
    service_id: ServiceId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    controller: Annotated[ServiceController, Depends(services)],
    page: Annotated[Paging, Depends(paging)],
) -> Page[ReplicaOut]:
    _readable(caller, controller, service_id)
    return page.page_of(controller.replicas(service_id), replica_out)


@router.get(
    "/{service_id}/events",
    response_model=Page[EventOut],
    responses=_404,
    summary="What happened to it, oldest first",
)
def service_events(
    service_id: ServiceId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    controller: Annotated[ServiceController, Depends(services)],
    page: Annotated[Paging, Depends(paging)],
) -> Page[EventOut]:
    _readable(caller, controller, service_id)

    def out(e: EventRecord) -> EventOut:
        return EventOut(at=e.at, kind=e.kind, message=e.message, workload_id=e.workload_id)

    return page.page_of(controller.events(service_id), out)


@router.get(
    "/{service_id}/logs",
    response_model=LogOut,
    responses=_404,
    summary="A replica's engine log from a byte offset",
)
def service_logs(
    service_id: ServiceId,
    caller: Annotated[Caller, requires(Scope.WORKLOADS_READ)],
    controller: Annotated[ServiceController, Depends(services)],
    replica: Annotated[int, Query(ge=1, le=1 << 30, description="The replica's number.")] = 1,
    offset: Annotated[int, Query(ge=0, le=1 << 50, description="Bytes to skip.")] = 0,
    limit: Annotated[int, Query(ge=1, le=MAX_LOG_BYTES, description="At most this many.")] = 65536,
) -> LogOut:
    view = _readable(caller, controller, service_id)
    last = view.service.next_replica - 1
    if replica > max(1, last):
        raise InvalidRequest("replica", replica, f"1 to {max(1, last)}")
    data = controller.read_log(service_id, replica, offset, limit).data
    return LogOut(
        service_id=service_id,
        replica=replica,
        offset=offset,
        next_offset=offset + len(data),
        text=data.decode("utf-8", errors="replace"),
    )
