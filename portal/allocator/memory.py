"""The allocator's in-memory state and the reads every decider needs.

``Memory`` is one set of containers — nodes, the cluster's free capacity, tenants, quotas, live
workloads, the queue and preemption indexes, the ledger, fairness history and this period's
GPU-hours — plus the read methods over them. Two kinds exist: the live ``state.State`` and a
decision's working copy ``draft.Draft`` (the same containers as copy-on-write overlays), so a
decider reads exactly the same way whether it looks at the live state or at its own draft.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, MutableSet
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from policies import fairness, quota
from policies.capacity import flavor_capacity
from policies.errors import NotFound
from policies.eta import RunLengths
from policies.inventory import Node
from policies.placement.framework import Policy
from policies.placement.state import ClusterState, Placement
from policies.preemption import PreemptionPolicy
from policies.requests import DeviceRequest, TopologyRequirement, WorkloadKind, WorkloadRequest
from portal.allocator.ledger import Ledger
from portal.store.records import (
    AllocationRecord,
    QuotaRecord,
    TenantRecord,
    WorkloadRecord,
    WorkloadState,
)

if TYPE_CHECKING:
    from portal.allocator.releases import ReleaseIndex


@dataclass(frozen=True, slots=True)
class Live:
    """A non-terminal workload in memory (immutable: a change replaces it)."""

    rec: WorkloadRecord
    req: WorkloadRequest
    seq: int
    allocations: tuple[AllocationRecord, ...] = ()
    # The latest wait message when only its figures changed since the persisted one.
    note: str | None = None

    @property
    def message(self) -> str:
        return self.note if self.note is not None else self.rec.message

    # When the devices are expected back (epoch seconds; inf: unknown), for ETAs: the
    # preemption deadline, else start plus expected duration. Kept, not computed per read: a
    # queue ETA reads it for every holder of a flavor.
    end_at: float = field(init=False, compare=False, repr=False)
    # What the queue order reads (``fairness.Queued``), kept so ordering a long queue makes
    # no object per queued workload.
    priority: int = field(init=False, compare=False, repr=False)
    tenant: str = field(init=False, compare=False, repr=False)
    enqueued_at: float = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        rec = self.rec
        object.__setattr__(self, "priority", rec.priority)
        object.__setattr__(self, "tenant", rec.tenant)
        object.__setattr__(self, "enqueued_at", rec.created_at.timestamp())
        if rec.state is WorkloadState.PREEMPTING and rec.preempt_deadline is not None:
            end = rec.preempt_deadline.timestamp()
        elif rec.expected_duration_s is not None and rec.started_at is not None:
            end = rec.started_at.timestamp() + rec.expected_duration_s
        else:
            end = float("inf")
        object.__setattr__(self, "end_at", end)


@dataclass(frozen=True, slots=True)
class ModelFacts:
    """The largest of each resource on the nodes that carry one GPU model: what a request for
    that model can ever get on one node."""

    gpus: int  # GPUs of the model on one node
    gpu_memory_mib: int  # memory of one GPU of the model
    cpu_milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class InventoryFacts:
    """Aggregates of the inventory that every request check needs; rebuilt only when the
    inventory changes (scanning every node per decision is O(nodes))."""

    models: frozenset[str]
    max_gpus: int
    max_cpu_milli: int
    max_memory_mib: int
    per_model: Mapping[str, ModelFacts] = field(default_factory=dict)

    @staticmethod
    def of(nodes: Mapping[str, Node]) -> InventoryFacts:
        models: set[str] = set()
        max_gpus = max_cpu = max_mem = 0
        per_model: dict[str, ModelFacts] = {}
        for n in nodes.values():
            models.update(g.model for g in n.gpus)
            max_gpus = max(max_gpus, len(n.gpus))
            max_cpu = max(max_cpu, n.cpu_milli)
            max_mem = max(max_mem, n.memory_mib)
            for model in {g.model for g in n.gpus}:
                mine = [g for g in n.gpus if g.model == model]
                old = per_model.get(model, ModelFacts(0, 0, 0, 0))
                per_model[model] = ModelFacts(
                    max(old.gpus, len(mine)),
                    max(old.gpu_memory_mib, max(g.memory_mib for g in mine)),
                    max(old.cpu_milli, n.cpu_milli),
                    max(old.memory_mib, n.memory_mib),
                )
        return InventoryFacts(frozenset(models), max_gpus, max_cpu, max_mem, per_model)


@dataclass(frozen=True, slots=True)
class Scalars:
    """The allocator's single values: arrival counter, the head-of-queue reservation, and
    which tenants the last release may have unblocked (read by the next partial cycle)."""

    seq: int = 0
    last_created: datetime | None = None
    reserved: frozenset[str] = frozenset()
    reserved_for: str | None = None
    # Per freed flavor, the tenants whose quota verdict the last release can change (None:
    # everyone).
    affected: tuple[tuple[str, frozenset[str] | None], ...] = ()
    # Per freed flavor, the tenants whose own usage of it fell (a flavor missing: unknown).
    freed_by: tuple[tuple[str, frozenset[str]], ...] = ()


class Derived:
    """Values computed from the containers, cached until the inventory or quotas change."""

    __slots__ = ("book", "cap_geq", "capacity", "facts", "flavors", "models")

    def __init__(self) -> None:
        self.capacity: dict[str, int] | None = None
        self.facts: InventoryFacts | None = None
        self.cap_geq: dict[str, float] | None = None
        self.book: quota.QuotaBook | None = None
        self.flavors: dict[DeviceRequest, frozenset[str]] = {}
        self.models: dict[DeviceRequest, tuple[str, ...]] = {}


@dataclass(slots=True)
class Memo:
    """Memos of pure functions of frozen request shapes (not state: never compared)."""

    flavor_names: dict[tuple[DeviceRequest, str], str] = field(default_factory=dict)
    member_shapes: dict[
        tuple[DeviceRequest, frozenset[str]], tuple[DeviceRequest, TopologyRequirement]
    ] = field(default_factory=dict)


class Memory:
    """Containers and reads; see the module docstring. Subclasses set every attribute."""

    cluster: ClusterState
    nodes: MutableMapping[str, Node]
    tenants: MutableMapping[str, TenantRecord]
    quotas: MutableMapping[tuple[str, str], QuotaRecord]
    live: MutableMapping[str, Live]
    queued: MutableSet[str]
    preempting: MutableSet[str]
    preempting_amount: MutableMapping[tuple[str, str], int]
    ledger: Ledger
    # When held devices come back, for ETAs; only the applied state keeps it (None: a draft).
    releases: ReleaseIndex | None
    # How long each tenant's runs of each kind took, for ETAs; the applied state only.
    run_lengths: RunLengths | None
    history: MutableMapping[str, tuple[float, datetime]]
    # (tenant, flavor, first day of the month) -> GPU-hours of allocations released that month.
    period: MutableMapping[tuple[str, str, datetime], float]
    scalars: Scalars
    derived: Derived
    memo: Memo
    policy: Policy
    preemption: PreemptionPolicy
    half_life_s: float

    # ---- changes of derived values (the ops call these) ----------------------------------

    def inventory_changed(self) -> None:
        self.derived = Derived()

    def quotas_changed(self) -> None:
        d = self.derived
        fresh = Derived()
        fresh.capacity, fresh.facts, fresh.cap_geq, fresh.flavors, fresh.models = (
            d.capacity,
            d.facts,
            d.cap_geq,
            d.flavors,
            d.models,
        )
        self.derived = fresh

    # ---- reads -------------------------------------------------------------------------

    def tenant(self, name: str) -> TenantRecord:
        try:
            return self.tenants[name]
        except KeyError:
            raise NotFound("tenant", name, sorted(self.tenants)) from None

    def capacity(self) -> dict[str, int]:
        d = self.derived
        if d.capacity is None:
            d.capacity = flavor_capacity(self.nodes.values())
        return d.capacity

    def facts(self) -> InventoryFacts:
        d = self.derived
        if d.facts is None:
            d.facts = InventoryFacts.of(self.nodes)
        return d.facts

    def capacity_geq(self) -> dict[str, float]:
        """Capacity per flavor in GPU-equivalents."""
        d = self.derived
        if d.cap_geq is None:
            d.cap_geq = {
                fl: quota.gpu_equivalent(quota.validate_flavor_name(fl), amount)
                for fl, amount in self.capacity().items()
            }
        return d.cap_geq

    def book(self) -> quota.QuotaBook:
        d = self.derived
        if d.book is None:
            per_tenant: dict[str, dict[str, quota.FlavorQuota]] = {t: {} for t in self.tenants}
            for (t, fl), q in self.quotas.items():
                per_tenant.setdefault(t, {})[fl] = quota.FlavorQuota(
                    guaranteed=q.guaranteed, limit=q.limit, budget_gpu_hours=q.budget_gpu_hours
                )
            tenants = {
                t: quota.TenantQuota(
                    tenant=t, quotas=per_tenant[t], cohort=rec.cohort, weight=rec.weight
                )
                for t, rec in self.tenants.items()
            }
            d.book = quota.QuotaBook(tenants=tenants, capacity=dict(self.capacity()))
        return d.book

    def models_for(self, req: WorkloadRequest) -> list[str]:
        """Models whose flavor for this request exists in the inventory."""
        dev = req.devices
        cache = self.derived.models
        got = cache.get(dev)
        if got is None:
            models = dev.models or self.facts().models
            cap = self.capacity()
            got = cache[dev] = tuple(
                m for m in sorted(models) if (fl := dev.flavor(m)) is not None and str(fl) in cap
            )
        return list(got)

    def flavors_for(self, req: WorkloadRequest) -> frozenset[str]:
        """Names of the flavors ``req`` could be counted as."""
        dev = req.devices
        cache = self.derived.flavors
        got = cache.get(dev)
        if got is None:
            got = cache[dev] = frozenset(str(dev.flavor(m)) for m in self.models_for(req))
        return got

    def flavor_name(self, dev: DeviceRequest, model: str) -> str:
        key = (dev, model)
        names = self.memo.flavor_names
        name = names.get(key)
        if name is None:
            name = names[key] = str(dev.flavor(model))
        return name

    def reclaimable_by_tenant(self, flavor: str) -> dict[str, int]:
        """Per tenant, the borrowed amount of ``flavor`` not already being preempted."""
        out: dict[str, int] = {}
        for (tenant, fl), held in self.ledger.usage.items():
            if fl == flavor:
                left = held - self.preempting_amount.get((tenant, fl), 0)
                if left > 0:
                    out[tenant] = left
        return out

    def gpu_hours_this_period(self, tenant: str, flavor: str, now: datetime) -> float:
        """GPU-hours of ``flavor`` the tenant used this calendar month (UTC), running
        included."""
        start = month_start(now)
        total = self.period.get((tenant, flavor, start), 0.0)
        for wid in self.ledger.holders_of(flavor):
            lv = self.live.get(wid)
            if lv is None or lv.rec.tenant != tenant:
                continue
            for a in lv.allocations:
                if a.flavor == flavor and a.created_at is not None:
                    hours = (now - max(a.created_at, start)).total_seconds() / 3600
                    total += a.gpu_equivalent * hours
        return total

    def budget_ok(self, tenant: str, flavor: str, now: datetime) -> bool:
        q = self.quotas.get((tenant, flavor))
        if q is None or q.budget_gpu_hours is None:
            return True
        used = self.gpu_hours_this_period(tenant, flavor, now)
        return not quota.budget_exhausted(
            quota.FlavorQuota(q.guaranteed, q.limit, q.budget_gpu_hours), used
        )

    def share(self, tenant: str, now: datetime) -> float:
        """The tenant's weighted dominant share with decayed history (queue order)."""
        hist, at = self.history.get(tenant, (0.0, now))
        rec = self.tenants.get(tenant)
        return fairness.dominant_share(
            self.ledger.tenant_gpu_equivalents(tenant),
            self.capacity_geq(),
            rec.weight if rec is not None else 1.0,
            history=fairness.decayed(hist, at.timestamp(), now.timestamp(), self.half_life_s),
        )

    def order(self, now: datetime, keep: Callable[[Live], bool] | None = None) -> list[Live]:
        """Queued workloads in scheduling order: priority, the tenant's weighted dominant
        share, then arrival. ``keep``: only those it accepts, in the same relative order (the
        order is total: ``seq`` is unique)."""
        live = self.live
        pending = [live[w] for w in self.queued]
        if keep is not None:
            pending = [lv for lv in pending if keep(lv)]
        shares = {t: self.share(t, now) for t in {lv.tenant for lv in pending}}
        return fairness.queue_order(pending, shares)

    def precedes(self, a: Live, b: Live, now: datetime) -> bool:
        """Whether queued ``a`` comes before queued ``b`` in ``order``."""
        shares = {t: self.share(t, now) for t in {a.tenant, b.tenant}}
        key = fairness.queue_key
        return key(a, shares) < key(b, shares)

    def grace_for(self, kind: str) -> timedelta:
        """How long a preempted workload of ``kind`` may keep its devices."""
        notice = self.preemption.notice("", WorkloadKind(kind), 0.0)
        return timedelta(seconds=notice.deadline_at)

    def affected(self) -> dict[str, frozenset[str] | None]:
        return dict(self.scalars.affected)

    def freed_by(self) -> dict[str, frozenset[str]]:
        return dict(self.scalars.freed_by)

    def observe(self, dev: DeviceRequest, placement: Placement) -> None:
        """A placement was committed: scorers that learn the request mix see it (the live
        state only; a draft's placements are seen once its decision is applied)."""


OUTSIDE_ENDS = frozenset({"preempted", "node-lost", "workload-gone", "conflict-at-start"})
"""End reasons that cut a run short from outside: such a run says nothing about how long the
tenant's work of its kind takes."""


def run_length(rec: WorkloadRecord) -> float | None:
    """Seconds an ended workload ran, when its length is its own (ETA history); else None."""
    if rec.started_at is None or rec.ended_at is None or rec.reason in OUTSIDE_ENDS:
        return None
    return max(0.0, (rec.ended_at - rec.started_at).total_seconds())


def month_start(at: datetime) -> datetime:
    return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def period_hours(begin: datetime, end: datetime) -> tuple[datetime, float]:
    """The month ``end`` falls in, and the hours of [begin, end] inside it."""
    start = month_start(end)
    return start, max(0.0, (end - max(begin, start)).total_seconds() / 3600)
