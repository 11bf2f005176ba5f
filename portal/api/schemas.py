"""Request and response bodies of ``/api/v1``. Every field says its bounds and what null means."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from policies.elastic import DEFAULT_IDLE_S, DEFAULT_THRESHOLD, DEFAULT_WINDOW_S, MAX_SECONDS
from policies.flavors import FlavorKind
from policies.quota import MAX_WEIGHT
from policies.requests import (
    MAX_GANG_SIZE,
    MAX_GPUS_PER_MEMBER,
    MAX_PRIORITY,
    TopologyRequirement,
    WorkloadKind,
)
from portal.api.inputs import KEY, Key, Label, Pool, Text, bounded
from portal.store.records import WorkloadState

MAX_PAGE = 500
T = TypeVar("T")


class Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class InModel(Model):
    """A request body: values are taken as sent, never coerced (``true`` or ``"2"`` is not a
    count), and NaN and infinity are refused. Enum fields say ``strict=False``: FastAPI
    validates the parsed JSON, where an enum arrives as its string value."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class ErrorBody(Model):
    """Every error answer."""

    status: int = Field(description="The HTTP status, repeated.")
    code: str = Field(
        description=(
            "Stable identifier: invalid, idempotency_mismatch, unauthorized, forbidden, "
            "not_found, conflict, precondition_failed, precondition_required, expired, "
            "unavailable, method_not_allowed."
        )
    )
    message: str = Field(description="What was wrong, with which value, and what would be valid.")
    field: str | None = Field(
        default=None, description="The offending input, when one is to blame; absent otherwise."
    )
    valid: str | None = Field(
        default=None, description="What the offending input may be; absent when not known."
    )
    retry_after_s: int | None = Field(
        default=None,
        description=(
            "With `unavailable`: seconds to wait before retrying (also sent as `Retry-After`); "
            "absent otherwise."
        ),
    )


class Page(Model, Generic[T]):
    """One page of a list, in the list's stable order."""

    items: list[T] = Field(description="At most `limit` items.")
    total: int = Field(ge=0, description="Items matching the filters, across all pages.")
    limit: int = Field(ge=1, le=MAX_PAGE, description="The page size asked for.")
    offset: int = Field(ge=0, description="Index of the first item of this page.")
    next_offset: int | None = Field(
        description="The `offset` of the next page; null on the last page."
    )


# ------------------------------------------------------------------ tenants and quotas


class TenantOut(Model):
    name: str = Field(description="The tenant: a JupyterHub group name (a DNS-1123 label).")
    cohort: str | None = Field(
        description="Cohort whose members lend each other unused guaranteed quota; null: none."
    )
    weight: float = Field(description="Fair-share weight (> 0); 1 is the default.")
    pools: list[str] = Field(description="Node pools reserved for this tenant, sorted.")
    version: int = Field(ge=1, description="Bumped on every change; the ETag.")


class TenantIn(InModel):
    cohort: Label | None = Field(default=None, description="Cohort name; null: no cohort.")
    weight: float = Field(
        default=1.0,
        gt=0,
        le=MAX_WEIGHT,
        description=f"Fair-share weight, > 0 and <= {MAX_WEIGHT:g}.",
    )
    pools: list[Pool] = Field(
        default_factory=list,
        max_length=64,
        description="Node pools the tenant may use (and that are reserved for such tenants).",
    )


class QuotaOut(Model):
    tenant: str = Field(description="The tenant.")
    flavor: str = Field(
        description="A GPU model (`H100-80GB`), MIG profile (`H100-80GB/3g.40gb`) or share."
    )
    guaranteed: int = Field(ge=0, description="Always obtainable, in the flavor's unit.")
    limit: int = Field(ge=0, description="Never exceeded, in the flavor's unit; >= guaranteed.")
    budget_gpu_hours: float | None = Field(
        description="GPU-hours per calendar month; null: no budget."
    )
    version: int = Field(ge=1, description="Bumped on every change; the ETag.")
    ceiling_guaranteed: int = Field(
        ge=0, description="The most the tenant's admins may set `guaranteed` to (platform's)."
    )
    ceiling_limit: int = Field(
        ge=0, description="The most the tenant's admins may set `limit` to (platform's)."
    )


class QuotaIn(InModel):
    guaranteed: int = Field(
        ge=0, le=10_000_000, description="Units (GPUs, instances or milli-GPU) always obtainable."
    )
    limit: int = Field(
        ge=0, le=10_000_000, description="Units never exceeded; must be >= guaranteed."
    )
    budget_gpu_hours: float | None = Field(
        default=None, ge=0, le=1e9, description="GPU-hours per calendar month; null: no budget."
    )
    ceiling_guaranteed: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description=(
            "Platform admins only: the most the tenant's admins may set `guaranteed` to; "
            ">= guaranteed. null: keep it (raised to `guaranteed` if lower; 0 for a new quota "
            "raised likewise). A tenant admin sending it gets 403."
        ),
    )
    ceiling_limit: int | None = Field(
        default=None,
        ge=0,
        le=10_000_000,
        description=(
            "Platform admins only: the most the tenant's admins may set `limit` to; >= limit "
            "and >= ceiling_guaranteed. null: keep it (raised to `limit` if lower)."
        ),
    )
    overcommit: bool = Field(
        default=False,
        description=(
            "Platform admins only: allow raising `guaranteed` although the flavor's "
            "guarantees then add up to more than its capacity (the Cluster view shows it). "
            "false: such a change is 422 naming the sum and the capacity."
        ),
    )


# ------------------------------------------------------------------ workloads


class DevicesIn(InModel):
    """The devices one gang member needs; ``kind`` picks the shape."""

    kind: FlavorKind | None = Field(
        default=None,
        strict=False,
        description=(
            "gpu: `count` whole GPUs; mig: one `mig_profile` instance; share: `milli` of one "
            "GPU; null: CPU only."
        ),
    )
    count: int = Field(
        default=0,
        ge=0,
        le=MAX_GPUS_PER_MEMBER,
        description=f"Whole GPUs (1..{MAX_GPUS_PER_MEMBER}) for kind gpu; 0 or 1 otherwise.",
    )
    models: list[Key] = Field(
        default_factory=list,
        max_length=32,
        description="Acceptable GPU models; empty: any (required for mig).",
    )
    mig_profile: Annotated[str, bounded(KEY, 64)] | None = Field(
        default=None, description="MIG profile, e.g. `3g.40gb`; null unless mig."
    )
    milli: int = Field(default=0, ge=0, le=999, description="Share of one GPU, 1..999 for share.")
    gpu_memory_mib: int = Field(
        default=0, ge=0, le=10_000_000, description="GPU memory of a share, MiB; 0: unbounded."
    )
    cpu_milli: int = Field(default=0, ge=0, le=10_000_000, description="CPU, milli-cores.")
    memory_mib: int = Field(default=0, ge=0, le=100_000_000, description="Host memory, MiB.")
    topology: TopologyRequirement = Field(
        default=TopologyRequirement.ANY,
        strict=False,
        description="How tightly the devices must be connected; nvlink needs >= 2 GPUs.",
    )


class WorkloadIn(InModel):
    tenant: Label = Field(description="The tenant charged; the caller must be a member of it.")
    name: Text = Field(description="A name for people.")
    kind: WorkloadKind = Field(
        default=WorkloadKind.NOTEBOOK, strict=False, description="What it runs."
    )
    devices: DevicesIn = Field(description="What each gang member needs.")
    gang_size: int = Field(
        default=1, ge=1, le=MAX_GANG_SIZE, description="Members that start all-or-nothing."
    )
    priority: int = Field(
        default=0,
        ge=-MAX_PRIORITY,
        le=MAX_PRIORITY,
        description="Higher is scheduled first; within a tenant's quota only.",
    )
    expected_duration_s: float | None = Field(
        default=None,
        gt=0,
        le=1e9,
        description="How long it expects to run, for queue ETAs; null: unknown.",
    )
    option: Key | None = Field(
        default=None,
        description=(
            "The spawn option (offer key, e.g. `gpu:H100-80GB:1`) these devices are: a "
            "notebook of one member with exactly the option's devices takes a pre-started "
            "placeholder of it when one is held. Null: none."
        ),
    )


class AllocationOut(Model):
    id: str
    member: int = Field(ge=0, description="Gang member index.")
    node: str = Field(description="The node the member runs on.")
    flavor: str = Field(description="What is counted against quota.")
    amount: int = Field(ge=0, description="Quota units held, in the flavor's unit.")
    gpu_equivalent: float = Field(ge=0, description="The amount as whole GPUs.")
    gpus: list[int] = Field(description="GPU indices on the node.")
    gpu_uuids: list[str] = Field(description="GPU (or MIG instance) UUIDs; may be empty.")
    milli: int = Field(ge=0, description="Per GPU: 1000 for whole GPUs, the share otherwise.")
    gpu_memory_mib: int = Field(ge=0, description="GPU memory of a share; 0 otherwise.")
    mig_profile: str | None = Field(description="The MIG profile; null unless MIG.")
    mig_start: int | None = Field(description="The MIG slot's start; null unless MIG.")
    borrowed: bool = Field(description="Above the tenant's guaranteed quota (preemptible).")


class WaitOut(Model):
    """How long a queued workload is expected to wait: one definition for a workload's status
    and a queue entry."""

    eta_s: float | None = Field(description="Estimated wait, seconds; null: cannot estimate.")
    eta_low_s: float | None = Field(
        default=None,
        description="Low end (p20) of the estimated wait, seconds; null with eta_s, and on the "
        "answer to a request (read the workload for it).",
    )
    eta_high_s: float | None = Field(
        default=None, description="High end (p80) of the estimated wait, seconds; null likewise."
    )
    eta_reason: str = Field(
        default="", description="Why the wait is what it is, in words (what is ahead, what frees)."
    )


class WorkloadOut(WaitOut):
    id: str
    tenant: str
    owner: str = Field(description="The hub user or service that requested it.")
    name: str
    kind: str
    state: WorkloadState
    reason: str = Field(
        description="Why it is queued (quota, capacity, topology, budget) or ended; '' if none."
    )
    message: str = Field(description="The reason as a sentence.")
    created_at: datetime
    started_at: datetime | None = Field(description="null until it runs.")
    ended_at: datetime | None = Field(description="null until it ends.")
    allocations: list[AllocationOut] = Field(description="Devices held; empty unless running.")
    position: int | None = Field(description="1-based queue position; null unless queued.")
    tenant_position: int | None = Field(description="Position among its tenant's; null likewise.")
    preempt_deadline: datetime | None = Field(description="When it is stopped; null: not told.")
    flavor: str | None = Field(description="Flavor of its first allocation; null: none.")


class QueueEntryOut(WaitOut):
    workload_id: str
    tenant: str
    owner: str
    name: str
    priority: int
    position: int = Field(ge=1, description="1-based, overall.")
    tenant_position: int = Field(ge=1, description="1-based, within the tenant.")
    reason: str = Field(description="quota, capacity, topology or budget.")
    message: str
    enqueued_at: datetime
    gpu_equivalent: float = Field(ge=0)


class UsageOut(Model):
    tenant: str
    flavor: str
    guaranteed: int = Field(ge=0)
    limit: int = Field(ge=0)
    used: int = Field(ge=0, description="Units held now.")
    borrowed: int = Field(ge=0, description="Units held above guaranteed.")
    lent: int = Field(ge=0, description="Unused guaranteed units cohort members use now.")


# ------------------------------------------------------------------ inventory


class MigInstanceOut(Model):
    profile: str
    start: int = Field(ge=0, description="Memory slice the instance starts at.")
    uuid: str | None = Field(description="MIG device UUID; null when not known.")
    free: bool = Field(description="Not allocated to any workload.")


class GpuOut(Model):
    index: int = Field(ge=0)
    model: str
    memory_mib: int = Field(ge=0)
    uuid: str = Field(description="GPU UUID; '' when not known.")
    mig_enabled: bool
    shareable: bool = Field(description="May be split into fractional shares.")
    free_milli: int = Field(ge=0, le=1000, description="Unallocated share; 1000: fully free.")
    free_memory_mib: int = Field(ge=0)
    mig_layout: list[MigInstanceOut] = Field(description="MIG instances; empty unless MIG.")


class NodeOut(Model):
    name: str
    schedulable: bool
    rack: str = Field(description="Rack; '' when not known.")
    zone: str
    clique: str = Field(description="NVLink clique; '' when none.")
    pool: str = Field(description="Pool reserving the node; '' when open to everyone.")
    cpu_milli: int = Field(ge=0)
    memory_mib: int = Field(ge=0)
    cpu_free_milli: int = Field(ge=0)
    memory_free_mib: int = Field(ge=0)
    gpus: list[GpuOut]
    links: list[list[str]] | None = Field(
        description=(
            "Link class between every GPU pair (row i, column j); null when unknown or when "
            "listed with `topology=false`."
        )
    )
    numa: list[int] | None = Field(
        description="NUMA node of each GPU; null when unknown or listed with `topology=false`."
    )


class NodeChangesOut(Model):
    """What changed in the inventory since a version read before (list-then-follow, as
    Kubernetes clients do with a resource version)."""

    version: str = Field(
        description="The inventory's version now: pass it as `since` to read the next changes."
    )
    nodes: list[NodeOut] = Field(description="Nodes added or changed since `since`, by name.")
    removed: list[str] = Field(description="Nodes gone from the inventory since `since`, sorted.")


class CapacityOut(Model):
    flavor: str
    capacity: int = Field(ge=0, description="Units the inventory holds, in the flavor's unit.")


# ------------------------------------------------------------------ elastic jobs


class ElasticLimitsIO(InModel):
    min_threshold: float = Field(
        default=0.0,
        ge=0.0,
        le=1.0,
        description="The lowest `threshold` the tenant's admins may set.",
    )
    min_window_s: float = Field(
        default=0.0,
        ge=0.0,
        le=MAX_SECONDS,
        description="The shortest `window_s` the tenant's admins may set.",
    )
    max_idle_s: float = Field(
        default=MAX_SECONDS,
        ge=0.0,
        le=MAX_SECONDS,
        description="The longest `idle_s` they may set.",
    )


class ElasticIn(InModel):
    threshold: float = Field(
        default=DEFAULT_THRESHOLD,
        ge=0.0,
        le=1.0,
        description="Grow when the job's GPU utilization (a fraction) stays at or above this.",
    )
    window_s: float = Field(
        default=DEFAULT_WINDOW_S, ge=0.0, le=MAX_SECONDS, description="... for this many seconds."
    )
    idle_s: float = Field(
        default=DEFAULT_IDLE_S,
        ge=0.0,
        le=MAX_SECONDS,
        description="Give back the newest slice once its GPUs were idle this many seconds.",
    )
    idle_below: float = Field(
        default=0.01,
        ge=0.0,
        le=1.0,
        description="Idle: utilization below this fraction; at most `threshold`.",
    )
    limits: ElasticLimitsIO | None = Field(
        default=None,
        description="Platform admins only: the bounds of the tenant's admins' edits. "
        "null: keep them. A tenant admin sending it gets 403.",
    )


class ElasticOut(Model):
    tenant: str
    threshold: float
    window_s: float
    idle_s: float
    idle_below: float
    limits: ElasticLimitsIO
    version: int = Field(description="0: never set (the defaults).")
