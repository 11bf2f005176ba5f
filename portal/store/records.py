"""Plain records the allocator keeps in memory and the store persists.

They are the contract between the allocator engine (``portal.allocator``) and the database
(``portal.store``): the engine decides on these, then hands a ``ChangeSet`` to the store, which
commits it in one transaction before the decision is acknowledged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum

from policies.elastic import ElasticLimits, ElasticSettings
from policies.jobs import JobState
from policies.ray import RayState, SliceState
from policies.services import ReplicaState, ServiceState


class WorkloadState(StrEnum):
    """Life of a workload. Terminal states: released, cancelled, failed."""

    QUEUED = "queued"  # waiting; ``reason`` says why
    RUNNING = "running"  # holds allocations
    PREEMPTING = "preempting"  # told to stop; allocations held until ``preempt_deadline``
    RELEASED = "released"
    CANCELLED = "cancelled"
    FAILED = "failed"

    @property
    def terminal(self) -> bool:
        return self in (WorkloadState.RELEASED, WorkloadState.CANCELLED, WorkloadState.FAILED)


@dataclass(frozen=True, slots=True)
class TenantRecord:
    name: str
    cohort: str | None = None
    weight: float = 1.0
    pools: tuple[str, ...] = ()
    version: int = 1


@dataclass(frozen=True, slots=True)
class QuotaRecord:
    """Quota of one tenant for one flavor, in the flavor's unit (GPUs, instances, milli-GPU).

    The ceilings are the platform admin's: the most the tenant's own admins may set
    ``guaranteed`` and ``limit`` to (``docs/quota.md``)."""

    tenant: str
    flavor: str
    guaranteed: int
    limit: int
    budget_gpu_hours: float | None = None
    version: int = 1
    ceiling_guaranteed: int = 0
    ceiling_limit: int = 0


@dataclass(frozen=True, slots=True)
class AllocationRecord:
    """Devices one gang member holds on one node."""

    id: str
    workload_id: str
    member: int
    node: str
    flavor: str
    amount: int  # in the flavor's unit
    gpu_equivalent: float
    gpus: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    milli: int = 0  # per GPU; 1000 for whole GPUs
    gpu_memory_mib: int = 0
    mig_profile: str | None = None
    mig_start: int | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    borrowed: bool = False
    created_at: datetime | None = None  # the store fills in the commit time when None
    released_at: datetime | None = None  # set by the store when read back; None while active


@dataclass(frozen=True, slots=True)
class WorkloadRecord:
    """A workload and its request, serialized as a JSON-compatible dict in ``request``."""

    id: str
    tenant: str
    owner: str
    name: str
    kind: str
    request: dict[str, object]
    gang_size: int
    priority: int
    state: WorkloadState
    created_at: datetime
    reason: str = ""
    message: str = ""
    idempotency_key: str | None = None
    started_at: datetime | None = None
    ended_at: datetime | None = None
    expected_duration_s: float | None = None
    preempt_deadline: datetime | None = None
    version: int = 1


@dataclass(frozen=True, slots=True)
class JobRecord:
    """A training job: its spec (``portal.jobs.spec.JobSpec.to_dict``) and where it stands.

    ``attempt`` is the number of the current (or last) attempt, 0 before the first;
    ``workload_id`` that attempt's allocator workload; ``restarts`` the attempts counted
    against ``max_restarts`` (preemptions are counted apart, in ``preemptions``)."""

    id: str
    tenant: str
    owner: str
    name: str
    spec: dict[str, object]
    state: JobState
    created_at: datetime
    updated_at: datetime
    reason: str = ""
    message: str = ""
    restarts: int = 0
    preemptions: int = 0
    attempt: int = 0
    workload_id: str | None = None
    topology_relaxed: bool = False
    next_start_at: datetime | None = None
    ended_at: datetime | None = None
    version: int = 1


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One run of a job. ``exit_reason`` is '' while it runs; ``counted``: it used one of
    the job's restarts; ``topology``: the level it was placed at (``any`` when relaxed)."""

    job_id: str
    number: int
    workload_id: str
    queued_at: datetime
    topology: str
    started_at: datetime | None = None
    ended_at: datetime | None = None
    nodes: tuple[str, ...] = ()
    exit_reason: str = ""
    exit_code: int | None = None
    counted: bool = False
    resume_from: str | None = None
    resume_step: int | None = None
    world_size: int | None = None
    """Members it ran with (an elastic job's changes with each resize); None: recorded before
    elastic jobs, the job's ``members``."""

    @property
    def queue_wait_s(self) -> float | None:
        """Seconds from queued to started; None until it starts."""
        if self.started_at is None:
            return None
        return (self.started_at - self.queued_at).total_seconds()


@dataclass(frozen=True, slots=True)
class ServiceRecord:
    """An inference service: its spec (``portal.inference.spec.ServiceSpec.to_dict``) and
    where it stands. ``desired``: the replicas the controller keeps (between the spec's min
    and max); ``failures``: replicas in a row that ended before they were ready."""

    id: str
    tenant: str
    owner: str
    name: str
    spec: dict[str, object]
    state: ServiceState
    created_at: datetime
    updated_at: datetime
    desired: int = 1
    message: str = ""
    failures: int = 0
    next_replica: int = 1
    last_request_at: datetime | None = None
    deleted_at: datetime | None = None
    version: int = 1


@dataclass(frozen=True, slots=True)
class ReplicaRecord:
    """One replica of a service: its allocator workload, and its engine process once placed
    (``port`` on this host's loopback for the local backend)."""

    service_id: str
    number: int
    workload_id: str
    state: ReplicaState
    queued_at: datetime
    node: str | None = None
    devices: tuple[str, ...] = ()
    port: int | None = None
    started_at: datetime | None = None
    ready_at: datetime | None = None
    ended_at: datetime | None = None
    reason: str = ""
    warm: bool = False  # started for the service's warm pool
    woken_at: datetime | None = None  # when it left the warm pool to serve

    @property
    def pooled(self) -> bool:
        """In the warm pool: started warm and not woken (queued, loading or asleep)."""
        return self.warm and self.woken_at is None


@dataclass(frozen=True, slots=True)
class EventRecord:
    at: datetime
    kind: str
    tenant: str | None
    workload_id: str | None
    message: str
    data: dict[str, object] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RayClusterRecord:
    """A Ray cluster: its spec (``portal.ray.spec.RaySpec.to_dict``, ``workers`` the count
    it should have now) and where it stands. ``address``: the head's ``host:port`` for
    ``ray.init`` (None until the head was started); ``head`` counts the head's starts."""

    id: str
    tenant: str
    owner: str
    name: str
    spec: dict[str, object]
    state: RayState
    created_at: datetime
    updated_at: datetime
    message: str = ""
    address: str | None = None
    head: int = 0
    ended_at: datetime | None = None
    version: int = 1


@dataclass(frozen=True, slots=True)
class RaySliceRecord:
    """Workers of a cluster held by one allocator workload: slice 1 is the gang admitted
    with the head (the ``min`` workers), each later one an increase. ``reason``: why it was
    released."""

    cluster_id: str
    number: int
    workload_id: str
    workers: int
    state: SliceState
    requested_at: datetime
    started_at: datetime | None = None
    released_at: datetime | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class RayJobAttempt:
    """One run of a Ray job's entrypoint. ``head``: the start of the cluster's head it ran
    against (a head started again ends the attempt without counting it as a failure);
    ``exit_code`` None while it runs."""

    number: int
    started_at: datetime
    head: int
    ended_at: datetime | None = None
    exit_code: int | None = None
    reason: str = ""


@dataclass(frozen=True, slots=True)
class ElasticSettingsRecord:
    """A tenant's stored elastic policy and the limits its own admins edit it within."""

    tenant: str
    settings: ElasticSettings
    limits: ElasticLimits
    updated_at: datetime
    version: int = 1


@dataclass(frozen=True, slots=True)
class RayJobRecord:
    """A Ray job: its spec (``portal.ray.jobspec.RayJobSpec.to_dict``), the cluster it runs
    on (``one_off``: created for it and deleted when it ends), where it stands, and its
    attempts, oldest first."""

    id: str
    tenant: str
    owner: str
    cluster_id: str
    one_off: bool
    spec: dict[str, object]
    state: JobState
    created_at: datetime
    updated_at: datetime
    message: str = ""
    attempt: int = 0
    attempts: tuple[RayJobAttempt, ...] = ()
    ended_at: datetime | None = None
    version: int = 1


@dataclass(slots=True)
class ChangeSet:
    """Everything one allocator decision changes, committed atomically by the store.

    ``quota_versions`` carries the versions the caller read, for optimistic concurrency: the
    store raises ``policies.errors.Conflict`` when a row's version moved meanwhile.
    """

    tenants: list[TenantRecord] = field(default_factory=list)
    deleted_tenants: list[str] = field(default_factory=list)
    quotas: list[QuotaRecord] = field(default_factory=list)
    deleted_quotas: list[tuple[str, str]] = field(default_factory=list)
    workloads: list[WorkloadRecord] = field(default_factory=list)  # upserts by id
    allocations: list[AllocationRecord] = field(default_factory=list)  # inserts
    released: list[tuple[str, datetime]] = field(default_factory=list)  # allocation id, when
    events: list[EventRecord] = field(default_factory=list)
    usage_history: dict[str, tuple[float, datetime]] = field(default_factory=dict)
    jobs: list[JobRecord] = field(default_factory=list)  # versioned upserts by id
    attempts: list[AttemptRecord] = field(default_factory=list)  # upserts by (job, number)
    services: list[ServiceRecord] = field(default_factory=list)  # versioned upserts by id
    replicas: list[ReplicaRecord] = field(default_factory=list)  # upserts by (service, number)
    ray_clusters: list[RayClusterRecord] = field(default_factory=list)  # versioned upserts
    ray_slices: list[RaySliceRecord] = field(default_factory=list)  # upserts by (cluster, number)
    ray_jobs: list[RayJobRecord] = field(default_factory=list)  # versioned upserts by id
    elastic: list[ElasticSettingsRecord] = field(default_factory=list)  # versioned, by tenant

    def empty(self) -> bool:
        return not (
            self.tenants
            or self.deleted_tenants
            or self.quotas
            or self.deleted_quotas
            or self.workloads
            or self.allocations
            or self.released
            or self.events
            or self.usage_history
            or self.jobs
            or self.attempts
            or self.services
            or self.replicas
            or self.ray_clusters
            or self.ray_slices
            or self.ray_jobs
            or self.elastic
        )


@dataclass(frozen=True, slots=True)
class StoredState:
    """What the store hands back on start: every tenant and quota, every non-terminal workload
    with its active (unreleased) allocations, and the fairness history."""

    tenants: list[TenantRecord]
    quotas: list[QuotaRecord]
    workloads: list[WorkloadRecord]
    allocations: list[AllocationRecord]
    usage_history: dict[str, tuple[float, datetime]]
