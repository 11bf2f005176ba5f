"""The allocator: single writer of allocations, quotas and the queue.

State lives in memory (cluster free capacity, usage per tenant and flavor, the queue) for speed
and in the database for durability. Every public method runs under one lock, decides on the
in-memory state, commits what it changed in one transaction, and only then returns; if the
commit fails the in-memory changes are undone, so memory and database never disagree.

The scheduling cycle (``_schedule``) reads as numbered steps: expire preemption grace periods,
order the queue, then for each pending workload in order: admit by quota, place, commit — with a
reservation for the first workload blocked by capacity so smaller ones cannot starve it.
"""

from __future__ import annotations

import threading
import uuid
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TypeVar

from policies import fairness, quota
from policies.capacity import flavor_capacity
from policies.errors import Conflict, Forbidden, InvalidRequest, NotFound
from policies.flavors import Flavor
from policies.inventory import Node
from policies.placement.framework import Policy
from policies.placement.scorers import policy as named_policy
from policies.placement.state import ClusterState, Placement
from policies.preemption import PreemptionPolicy
from policies.requests import DeviceRequest, TopologyRequirement, WorkloadKind, WorkloadRequest
from portal.allocator import codec, estimates, nodes, scheduling
from portal.allocator.ledger import Ledger
from portal.allocator.live import InventoryFacts, Live, Txn
from portal.allocator.views import QueueEntry, ReconcileReport, WorkloadStatus, status_of
from portal.store.records import (
    AllocationRecord,
    EventRecord,
    QuotaRecord,
    TenantRecord,
    WorkloadRecord,
    WorkloadState,
)
from portal.store.writer import Store

Clock = Callable[[], datetime]
T = TypeVar("T")


def utcnow() -> datetime:
    return datetime.now(UTC)


class Allocator:
    """Quota-aware, topology-aware allocator. Thread-safe; one instance per portal."""

    def __init__(
        self,
        store: Store,
        *,
        policy: Policy | None = None,
        clock: Clock = utcnow,
        preemption: PreemptionPolicy | None = None,
        fairness_half_life_s: float = 24 * 3600.0,
    ) -> None:
        self._store = store
        self._policy = policy or named_policy("binpack")
        self._clock = clock
        self._preemption = preemption or PreemptionPolicy()
        self._half_life = fairness_half_life_s
        self._lock = threading.RLock()
        self._cluster = ClusterState()
        # Positions in the cluster's change log mean something only to this allocator.
        self._epoch = uuid.uuid4().hex[:12]
        self._nodes: dict[str, Node] = {}
        self._tenants: dict[str, TenantRecord] = {}
        self._quotas: dict[tuple[str, str], QuotaRecord] = {}
        self._live: dict[str, Live] = {}
        self._ledger = Ledger()
        self._history: dict[str, tuple[float, datetime]] = {}
        self._seq = 0
        self._capacity: dict[str, int] = {}
        self._facts: InventoryFacts | None = None
        self._book: quota.QuotaBook | None = None
        self._reserved: frozenset[str] = frozenset()
        self._queued: set[str] = set()
        self._cap_geq: dict[str, float] | None = None
        # Memos keyed by (hashable, frozen) request shapes; bounded by the shapes people ask for.
        self._flavor_names: dict[tuple[DeviceRequest, str], str] = {}
        self._member_shapes: dict[
            tuple[DeviceRequest, frozenset[str]], tuple[DeviceRequest, TopologyRequirement]
        ] = {}
        self._last_created: datetime | None = None
        self._preempting_amount: Counter[tuple[str, str]] = Counter()
        # Per freed flavor, the tenants whose quota verdict the last release can change
        # (None: everyone); read by the next partial scheduling cycle.
        self._affected: dict[str, frozenset[str] | None] = {}
        self._reserved_for: str | None = None
        self._flavor_cache: dict[object, frozenset[str]] = {}
        self._preempting: set[str] = set()
        self._period_start: datetime | None = None
        self._period_done: dict[tuple[str, str], float] = {}
        self._started = False

    # ---------------------------------------------------------------- lifecycle

    def start(self, nodes: Iterable[Node]) -> ReconcileReport:
        """Rebuild from the database and the given inventory.

        Allocations on nodes that are gone are released (their workloads fail with reason
        ``node-lost``); everything else is re-applied to the in-memory cluster state.
        """
        with self._lock:
            for n in nodes:
                self._add_node(n)
            stored = self._store.load()
            self._tenants = {t.name: t for t in stored.tenants}
            self._quotas = {(q.tenant, q.flavor): q for q in stored.quotas}
            self._history = dict(stored.usage_history)
            by_wl: dict[str, list[AllocationRecord]] = {}
            for a in stored.allocations:
                by_wl.setdefault(a.workload_id, []).append(a)
            lost: list[str] = []
            for rec in sorted(stored.workloads, key=lambda r: (r.created_at, r.id)):
                self._last_created = max(self._last_created or rec.created_at, rec.created_at)
                live = self._revive(rec, by_wl.get(rec.id, []))
                if live is None:
                    lost.append(rec.id)
            self._refresh_book()
            txn = Txn()
            now = self._clock()
            for wid in lost:
                self._finish(txn, self._live[wid], WorkloadState.FAILED, "node-lost", now)
            self._schedule(txn)
            self._commit(txn)
            self._started = True
            return ReconcileReport(released=tuple(lost), node_lost=tuple(lost))

    def _revive(self, rec: WorkloadRecord, allocs: list[AllocationRecord]) -> Live | None:
        """Re-create a stored workload in memory; None if its devices are on a lost node."""
        self._seq += 1
        req = codec.workload_request_from_record(
            rec.tenant, rec.owner, rec.name, rec.kind, rec.request, rec.gang_size, rec.priority
        )
        live = Live(rec, req, self._seq)
        self._live[rec.id] = live
        self._index_state(rec.id, WorkloadState.RELEASED, rec.state)
        if rec.state is WorkloadState.QUEUED:
            return live
        lost = any(a.node not in self._nodes for a in allocs)
        for a in allocs:
            if not lost:
                self._cluster.apply(self._restored_placement(a))
            self._ledger.add(a, rec)
        live.allocations = allocs
        self._set_end(Txn(), live)
        if rec.state is WorkloadState.PREEMPTING:
            for a in allocs:
                if a.flavor:
                    self._preempting_amount[(rec.tenant, a.flavor)] += a.amount
        return None if lost else live  # the caller fails a lost one with reason node-lost

    def _restored_placement(self, a: AllocationRecord) -> Placement:
        p = codec.placement_of(a)
        if p.mig_profile is not None:
            st = self._cluster.node(a.node)
            g = p.gpus[0]
            if not any(i.start == p.mig_start for i in st.mig_layout[g]):
                p = replace(p, mig_created=True)
        return p

    # ---------------------------------------------------------------- tenants and quotas

    def set_tenant(
        self,
        name: str,
        *,
        cohort: str | None = None,
        weight: float = 1.0,
        pools: Iterable[str] = (),
        expected_version: int | None = None,
    ) -> TenantRecord:
        """Create or update a tenant. ``expected_version`` guards against lost updates."""
        with self._lock:
            quota.validate_tenant_name(name)
            old = self._tenants.get(name)
            self._check_version("tenant", name, old.version if old else None, expected_version)
            rec = TenantRecord(
                name,
                cohort,
                float(weight),
                tuple(sorted(set(pools))),
                (old.version + 1) if old else 1,
            )
            quota.TenantQuota(tenant=name, quotas={}, cohort=cohort, weight=rec.weight)
            txn = Txn()
            self._tenants[name] = rec
            txn.undo.append(lambda: self._restore(self._tenants, name, old))
            txn.changes.tenants.append(rec)
            self._event(txn, "tenant.set", name, None, f"tenant {name} set", {"cohort": cohort})
            self._invalidate_book()
            txn.undo.append(self._invalidate_book)
            self._schedule(txn)
            self._commit(txn)
            return rec

    def set_quota(
        self,
        tenant: str,
        flavor: str,
        *,
        guaranteed: int,
        limit: int,
        budget_gpu_hours: float | None = None,
        expected_version: int | None = None,
    ) -> QuotaRecord:
        """Set a tenant's quota for a flavor. Lowering it below usage stops nothing: it blocks
        new work and reclaims borrowed work by the normal preemption rules."""
        with self._lock:
            self._tenant(tenant)
            fl = str(Flavor.parse(flavor))
            quota.FlavorQuota(guaranteed=guaranteed, limit=limit, budget_gpu_hours=budget_gpu_hours)
            key = (tenant, fl)
            old = self._quotas.get(key)
            self._check_version(
                "quota", f"{tenant}/{fl}", old.version if old else None, expected_version
            )
            rec = QuotaRecord(
                tenant, fl, guaranteed, limit, budget_gpu_hours, (old.version + 1) if old else 1
            )
            txn = Txn()
            self._quotas[key] = rec
            txn.undo.append(lambda: self._restore(self._quotas, key, old))
            txn.changes.quotas.append(rec)
            self._event(
                txn,
                "quota.set",
                tenant,
                None,
                f"quota {tenant} {fl}: {guaranteed}/{limit}",
                {"flavor": fl, "guaranteed": guaranteed, "limit": limit},
            )
            self._invalidate_book()
            txn.undo.append(self._invalidate_book)
            self._schedule(txn)
            self._commit(txn)
            return rec

    def tenants(self) -> list[TenantRecord]:
        with self._lock:
            return sorted(self._tenants.values(), key=lambda t: t.name)

    def quotas(self, tenant: str | None = None) -> list[QuotaRecord]:
        with self._lock:
            return sorted(
                (q for q in self._quotas.values() if tenant is None or q.tenant == tenant),
                key=lambda q: (q.tenant, q.flavor),
            )

    # ---------------------------------------------------------------- workloads

    def request(
        self,
        req: WorkloadRequest,
        *,
        idempotency_key: str | None = None,
        expected_duration_s: float | None = None,
    ) -> WorkloadStatus:
        """Allocate now if quota and capacity allow, else queue with a reason.

        A retry with the same ``idempotency_key`` (per tenant and owner) returns the first
        answer's workload instead of allocating again.
        """
        with self._lock:
            self._tenant(req.tenant)
            self._check_request(req)
            if idempotency_key is not None:
                prior = self._by_idempotency(req, idempotency_key)
                if prior is not None:
                    return prior
            now = self._clock()
            # Arrival order must survive a restart, which re-sorts by creation time: keep
            # creation times strictly increasing even when the clock repeats itself.
            if self._last_created is not None and now <= self._last_created:
                now = self._last_created + timedelta(microseconds=1)
            self._last_created = now
            self._seq += 1
            rec = WorkloadRecord(
                id=uuid.uuid4().hex,
                tenant=req.tenant,
                owner=req.owner,
                name=req.name,
                kind=req.kind.value,
                request=codec.device_request_to_dict(req.devices),
                gang_size=req.gang_size,
                priority=req.priority,
                state=WorkloadState.QUEUED,
                created_at=now,
                idempotency_key=idempotency_key,
                expected_duration_s=expected_duration_s,
            )
            live = Live(rec, req, self._seq)
            txn = Txn()
            self._live[rec.id] = live
            self._queued.add(rec.id)
            txn.undo.append(lambda: self._live.pop(rec.id, None))
            txn.undo.append(partial(self._queued.discard, rec.id))
            txn.changes.workloads.append(rec)
            self._event(
                txn, "workload.requested", req.tenant, rec.id, f"{req.owner} asked for {req.name}"
            )
            self._schedule(txn, fresh=rec.id)
            self._commit(txn)
            return self._status(self._live.get(rec.id) or live)

    def release(self, workload_id: str, *, reason: str = "released") -> WorkloadStatus:
        """Release a workload's devices (or cancel it while queued). Idempotent."""
        with self._lock:
            live = self._live.get(workload_id)
            if live is None:
                stored = self._store.workload(workload_id)
                if stored is None:
                    raise NotFound("workload", workload_id)
                return self._status_of_record(stored)
            txn = Txn()
            state = (
                WorkloadState.CANCELLED
                if live.rec.state is WorkloadState.QUEUED
                else WorkloadState.RELEASED
            )
            freed = frozenset(a.flavor for a in live.allocations if a.flavor)
            book = self._quota_book()
            self._affected = {
                fl: quota.affected_by_release(book, self._ledger.usage, live.rec.tenant, fl)
                for fl in freed
            }
            self._finish(txn, live, state, reason, self._clock())
            self._schedule(txn, freed=freed)
            self._commit(txn)
            return self._status_of_record(live.rec)

    cancel = release

    def status(self, workload_id: str) -> WorkloadStatus:
        with self._lock:
            live = self._live.get(workload_id)
            if live is not None:
                return self._status(live)
            stored = self._store.workload(workload_id)
            if stored is None:
                raise NotFound("workload", workload_id)
            return self._status_of_record(stored)

    def workloads(self, tenant: str | None = None) -> list[WorkloadStatus]:
        """Every non-terminal workload (optionally of one tenant)."""
        with self._lock:
            return [
                self._status(lv)
                for lv in sorted(self._live.values(), key=lambda lv: lv.seq)
                if tenant is None or lv.rec.tenant == tenant
            ]

    def queue(self, tenant: str | None = None) -> list[QueueEntry]:
        with self._lock:
            return [e for e in self._queue_entries() if tenant is None or e.tenant == tenant]

    def queue_counts(self) -> Counter[tuple[str, str]]:
        """Queued workloads per (tenant, reason): without ordering the queue or computing ETAs,
        so cheap enough for every metrics scrape."""
        with self._lock:
            recs = (self._live[w].rec for w in self._queued)
            return Counter((r.tenant, r.reason) for r in recs)

    def usage(self, tenant: str | None = None) -> list[quota.FlavorUsage]:
        """Guaranteed, limit, used, borrowed and lent per flavor for one or all tenants."""
        with self._lock:
            book = self._quota_book()
            names = [tenant] if tenant is not None else sorted(self._tenants)
            out: list[quota.FlavorUsage] = []
            for t in names:
                self._tenant(t)
                out.extend(quota.usage_summary(book, self._ledger.usage, t))
            return out

    def tick(self) -> None:
        """Advance time: end expired preemption grace periods and schedule the queue."""
        with self._lock:
            txn = Txn()
            self._schedule(txn)
            self._commit(txn)

    # ---------------------------------------------------------------- inventory

    def node_added(self, node: Node) -> None:
        """A node appeared (or, if known, changed)."""
        with self._lock:
            nodes.added(self, node)

    def node_updated(self, node: Node) -> None:
        """Replace a node's description, keeping its allocations (cordon, labels, layout)."""
        with self._lock:
            nodes.updated(self, node)

    def node_removed(self, name: str) -> list[str]:
        """A node is gone: its workloads fail with reason ``node-lost``. Returns their ids."""
        with self._lock:
            return nodes.removed(self, name)

    def reconcile(self, running: set[str]) -> ReconcileReport:
        """Release allocations of workloads the platform no longer runs (``running`` holds the
        ids it runs); flag running ids the allocator does not know."""
        with self._lock:
            return nodes.reconcile(self, running)

    # ---------------------------------------------------------------- introspection

    def allocations(self) -> list[AllocationRecord]:
        with self._lock:
            return [a for lv in self._live.values() for a in lv.allocations]

    @property
    def cluster(self) -> ClusterState:
        """The live cluster state; read it through ``inspect`` from other threads."""
        return self._cluster

    @property
    def epoch(self) -> str:
        """Random per allocator: tells a change-log position (``ClusterState.seq``) of this
        allocator from one of another process or an earlier start."""
        return self._epoch

    def inspect(self, read: Callable[[ClusterState], T]) -> T:
        """Run ``read`` on the cluster state under the allocator's lock, for a consistent view."""
        with self._lock:
            return read(self._cluster)

    @property
    def started(self) -> bool:
        """Whether ``start`` finished (memory rebuilt from the database and inventory)."""
        return self._started

    @property
    def capacity(self) -> dict[str, int]:
        return dict(self._capacity)

    @property
    def store(self) -> Store:
        """The store the allocator commits to; readers (accounting) use it from any thread."""
        return self._store

    # ================================================================ internals

    def _tenant(self, name: str) -> TenantRecord:
        try:
            return self._tenants[name]
        except KeyError:
            raise NotFound("tenant", name, list(self._tenants)) from None

    def _check_version(
        self, kind: str, name: str, current: int | None, expected: int | None
    ) -> None:
        if expected is not None and expected != (current or 0):
            raise Conflict(
                f"{kind} {name} changed meanwhile: you read version {expected}, "
                f"it is now version {current or 0}; re-read it and apply your change again"
            )

    @staticmethod
    def _restore(d: dict, key: object, old: object) -> None:  # type: ignore[type-arg]
        if old is None:
            d.pop(key, None)
        else:
            d[key] = old

    def _check_request(self, req: WorkloadRequest) -> None:
        """Static checks against the inventory: models exist, the shape can ever fit."""
        dev = req.devices
        facts = self._inventory_facts()
        known = facts.models
        unknown = sorted(set(dev.models) - known)
        if dev.kind is not None and unknown:
            raise InvalidRequest(
                "GPU model", ", ".join(unknown), "one of " + (", ".join(sorted(known)) or "none")
            )
        biggest_gpus = facts.max_gpus
        if dev.count > biggest_gpus:
            raise InvalidRequest(
                "GPU count", dev.count, f"at most {biggest_gpus} (the largest node's GPUs)"
            )
        biggest_cpu = facts.max_cpu_milli
        biggest_mem = facts.max_memory_mib
        if dev.cpu_milli > biggest_cpu or dev.memory_mib > biggest_mem:
            raise InvalidRequest(
                "cpu/memory",
                f"{dev.cpu_milli}m/{dev.memory_mib}Mi",
                f"at most {biggest_cpu}m/{biggest_mem}Mi (the largest node)",
            )
        models = self._models_for(req) if dev.kind is not None else []
        if dev.kind is not None and not models:
            raise InvalidRequest(
                "request",
                f"{dev.kind.value} on {sorted(dev.models) or 'any model'}",
                "a flavor the inventory offers: " + ", ".join(sorted(self._capacity)),
            )
        if models:
            self._check_quota_allows(req, models)

    def _check_quota_allows(self, req: WorkloadRequest, models: list[str]) -> None:
        """Refuse what no quota of the tenant could ever admit (no quota for any candidate
        flavor, or more than its limit) instead of queueing it forever; the spawner's
        offers call the same cases "not allowed"."""
        amount = req.devices.amount() * req.gang_size
        why = []
        for m in models:
            fl = str(req.devices.flavor(m))
            q = self._quotas.get((req.tenant, fl))
            if q is not None and 0 < amount <= q.limit:
                return
            why.append(f"{fl}: " + (f"limit {q.limit}" if q is not None else "no quota"))
        raise Forbidden(
            f"{req.tenant} can never be given {amount} of what {req.name or 'this request'} "
            f"asks for ({'; '.join(why)}); ask a tenant admin for quota"
        )

    def _models_for(self, req: WorkloadRequest) -> list[str]:
        """Models whose flavor for this request exists in the inventory."""
        dev = req.devices
        models = dev.models or self._inventory_facts().models
        out = []
        for m in sorted(models):
            fl = dev.flavor(m)
            if fl is not None and str(fl) in self._capacity:
                out.append(m)
        return out

    def _by_idempotency(self, req: WorkloadRequest, key: str) -> WorkloadStatus | None:
        for lv in self._live.values():
            r = lv.rec
            if r.idempotency_key == key and r.tenant == req.tenant and r.owner == req.owner:
                return self._status(lv)
        stored = self._store.workload_by_idempotency_key(req.tenant, req.owner, key)
        return self._status_of_record(stored) if stored is not None else None

    def _add_node(self, node: Node) -> None:
        # Capacity is recomputed by the caller once all nodes are in (_refresh_book): doing it
        # here made start() quadratic in the number of nodes.
        self._cluster.add_node(node)
        self._nodes[node.name] = node
        self._facts = None

    def _inventory_facts(self) -> InventoryFacts:
        if self._facts is None:
            self._facts = InventoryFacts.of(self._nodes.values())
        return self._facts

    def _after_inventory_change(self) -> None:
        self._refresh_book()
        txn = Txn()
        self._schedule(txn)
        self._commit(txn)

    def _refresh_book(self) -> None:
        """After an inventory change: capacity, inventory facts and the quota book."""
        self._capacity = flavor_capacity(self._nodes.values())
        self._book = None
        self._facts = None
        self._cap_geq = None
        self._flavor_cache = {}

    def _invalidate_book(self) -> None:
        """After a tenant or quota change: only the quota book."""
        self._book = None

    def _quota_book(self) -> quota.QuotaBook:
        if self._book is None:
            per_tenant: dict[str, dict[str, quota.FlavorQuota]] = {t: {} for t in self._tenants}
            for (t, fl), q in self._quotas.items():
                per_tenant.setdefault(t, {})[fl] = quota.FlavorQuota(
                    guaranteed=q.guaranteed, limit=q.limit, budget_gpu_hours=q.budget_gpu_hours
                )
            tenants = {
                t: quota.TenantQuota(
                    tenant=t,
                    quotas=per_tenant[t],
                    cohort=self._tenants[t].cohort,
                    weight=self._tenants[t].weight,
                )
                for t in self._tenants
            }
            self._book = quota.QuotaBook(tenants=tenants, capacity=dict(self._capacity))
        return self._book

    def _event(
        self,
        txn: Txn,
        kind: str,
        tenant: str | None,
        workload_id: str | None,
        message: str,
        data: dict[str, object] | None = None,
    ) -> None:
        txn.changes.events.append(
            EventRecord(self._clock(), kind, tenant, workload_id, message, data or {})
        )

    def _commit(self, txn: Txn) -> None:
        if txn.changes.empty():
            return
        try:
            self._store.commit(txn.changes)
        except BaseException:
            for undo in reversed(txn.undo):
                undo()
            raise

    # ---- state changes (each registers its undo) ---------------------------------------

    def _set_record(self, txn: Txn, live: Live, rec: WorkloadRecord) -> None:
        """Replace the workload's record; one version step per transaction, however many
        changes the transaction makes to it."""
        old = live.rec
        live.note = None
        pending = [w for w in txn.changes.workloads if w.id == rec.id]
        live.rec = replace(rec, version=old.version if pending else old.version + 1)
        txn.undo.append(lambda: setattr(live, "rec", old))
        txn.changes.workloads = [w for w in txn.changes.workloads if w.id != rec.id]
        txn.changes.workloads.append(live.rec)
        self._index_state(live.rec.id, old.state, live.rec.state)
        txn.undo.append(partial(self._index_state, live.rec.id, live.rec.state, old.state))

    def _index_state(self, wid: str, old: WorkloadState, new: WorkloadState) -> None:
        """Keep the sets of queued and preempting workloads current."""
        for state, ids in (
            (WorkloadState.QUEUED, self._queued),
            (WorkloadState.PREEMPTING, self._preempting),
        ):
            if old is state and new is not state:
                ids.discard(wid)
            elif new is state:
                ids.add(wid)

    def _finish(
        self, txn: Txn, live: Live, state: WorkloadState, reason: str, now: datetime
    ) -> None:
        if live.allocations:
            self._touch_history(txn, live.rec.tenant, now)
        if live.rec.state is WorkloadState.PREEMPTING:
            self._mark_preempting(txn, live, -1)
        for a in list(live.allocations):
            if a.node in self._nodes:  # a lost node's devices are gone with it
                p = self._restored_placement(a)
                self._cluster.unapply(p)
                txn.undo.append(partial(self._cluster.apply, p))
            self._ledger.remove(a, live.rec)
            txn.undo.append(partial(self._ledger.add, a, live.rec))
            txn.changes.released.append((a.id, now))
            if a.created_at is not None:
                self._add_period(live.rec.tenant, a.flavor, a.gpu_equivalent, a.created_at, now)
        old_allocs = live.allocations
        live.allocations = []
        txn.undo.append(lambda: setattr(live, "allocations", old_allocs))
        self._set_record(
            txn,
            live,
            replace(live.rec, state=state, reason=reason, ended_at=now, preempt_deadline=None),
        )
        wid = live.rec.id
        self._live.pop(wid, None)
        txn.undo.append(lambda: self._live.__setitem__(wid, live))
        self._event(
            txn, f"workload.{state.value}", live.rec.tenant, wid, f"{live.rec.name}: {reason}"
        )

    def _start(
        self, txn: Txn, live: Live, placed: list[Placement], borrowed: int, now: datetime
    ) -> None:
        self._touch_history(txn, live.rec.tenant, now)
        allocs: list[AllocationRecord] = []
        for i, p in enumerate(placed):
            self._cluster.apply(p)
            txn.undo.append(partial(self._cluster.unapply, p))
            node = self._nodes[p.node]
            model = node.gpus[p.gpus[0]].model if p.gpus else ""
            fl = live.req.devices.flavor(model)
            gpu_eq = live.req.devices.gpu_equivalent(model) if fl is not None else 0.0
            rec = AllocationRecord(
                id=uuid.uuid4().hex,
                workload_id=live.rec.id,
                member=i,
                node=p.node,
                flavor=str(fl) if fl is not None else "",
                amount=live.req.devices.amount(),
                gpu_equivalent=gpu_eq,
                gpus=p.gpus,
                gpu_uuids=_device_uuids(node, p),
                milli=p.milli,
                gpu_memory_mib=p.gpu_memory_mib,
                mig_profile=p.mig_profile,
                mig_start=p.mig_start,
                cpu_milli=p.cpu_milli,
                memory_mib=p.memory_mib,
                borrowed=borrowed > 0,
                created_at=now,
            )
            allocs.append(rec)
            self._ledger.add(rec, live.rec)
            txn.undo.append(partial(self._ledger.remove, rec, live.rec))
            self._policy.observe(live.req.devices, p)
        live.allocations = allocs
        txn.undo.append(lambda: setattr(live, "allocations", []))
        txn.changes.allocations.extend(allocs)
        self._set_record(
            txn,
            live,
            replace(live.rec, state=WorkloadState.RUNNING, reason="", message="", started_at=now),
        )
        self._set_end(txn, live)
        where = ", ".join(f"{p.node}:{list(p.gpus)}" for p in placed)
        self._event(
            txn, "workload.started", live.rec.tenant, live.rec.id, f"{live.rec.name} on {where}"
        )

    # ---- scheduling ------------------------------------------------------------------

    def _schedule(
        self, txn: Txn, fresh: str | None = None, freed: frozenset[str] | None = None
    ) -> None:
        scheduling.schedule(self, txn, fresh, freed)

    def _capacity_geq(self) -> dict[str, float]:
        """Capacity per flavor in GPU-equivalents (cached until the inventory changes)."""
        if self._cap_geq is None:
            self._cap_geq = {
                fl: quota.gpu_equivalent(quota.validate_flavor_name(fl), amount)
                for fl, amount in self._capacity.items()
            }
        return self._cap_geq

    def _flavor_name(self, dev: DeviceRequest, model: str) -> str:
        key = (dev, model)
        name = self._flavor_names.get(key)
        if name is None:
            name = self._flavor_names[key] = str(dev.flavor(model))
        return name

    def _flavors_for(self, req: WorkloadRequest) -> frozenset[str]:
        """Names of the flavors ``req`` could be counted as (cached until the inventory
        changes)."""
        dev = req.devices
        got = self._flavor_cache.get(dev)
        if got is None:
            got = frozenset(str(dev.flavor(m)) for m in self._models_for(req))
            self._flavor_cache[dev] = got
        return got

    def _queue_entries(self) -> list[QueueEntry]:
        return scheduling.queue_entries(self)

    def _reclaimable_by_tenant(self, flavor: str) -> dict[str, int]:
        """Per tenant, the borrowed amount of ``flavor`` not already being preempted."""
        out: dict[str, int] = {}
        for (tenant, fl), held in self._ledger.usage.items():
            if fl == flavor:
                left = held - self._preempting_amount.get((tenant, fl), 0)
                if left > 0:
                    out[tenant] = left
        return out

    def _set_end(self, txn: Txn, live: Live) -> None:
        """Cache when ``live``'s devices are expected back: its preemption deadline, else its
        start plus expected duration, else never known."""
        rec = live.rec
        if rec.state is WorkloadState.PREEMPTING and rec.preempt_deadline is not None:
            end = rec.preempt_deadline.timestamp()
        elif rec.expected_duration_s is not None and rec.started_at is not None:
            end = rec.started_at.timestamp() + rec.expected_duration_s
        else:
            end = float("inf")
        txn.undo.append(partial(setattr, live, "end_at", live.end_at))
        live.end_at = end

    def _mark_preempting(self, txn: Txn, live: Live, sign: int) -> None:
        """Count (sign 1) or stop counting (sign -1) a workload's devices as being preempted."""
        for a in live.allocations:
            if a.flavor:
                key = (live.rec.tenant, a.flavor)
                self._preempting_amount[key] += sign * a.amount
                txn.undo.append(partial(self._preempting_amount.update, {key: -sign * a.amount}))

    def _eta(self, lv: Live, ahead: list[Live], now: datetime) -> float | None:
        return estimates.eta(self, lv, ahead, now)

    def _touch_history(self, txn: Txn, tenant: str, now: datetime) -> None:
        """Fold the tenant's usage since the last change into its decayed history."""
        value, last = self._history.get(tenant, (0.0, now))
        current = sum(self._ledger.tenant_gpu_equivalents(tenant).values())
        new = (
            fairness.accumulate(value, last.timestamp(), now.timestamp(), current, self._half_life),
            now,
        )
        old = self._history.get(tenant)
        self._history[tenant] = new
        txn.undo.append(lambda: self._restore(self._history, tenant, old))
        txn.changes.usage_history[tenant] = new

    def _gpu_hours_this_period(self, tenant: str, flavor: str, now: datetime) -> float:
        return estimates.gpu_hours_this_period(self, tenant, flavor, now)

    def _add_period(
        self, tenant: str, flavor: str, gpu_eq: float, begin: datetime, end: datetime
    ) -> None:
        estimates.add_period(self, tenant, flavor, gpu_eq, begin, end)

    def _status(self, live: Live) -> WorkloadStatus:
        pos = tpos = eta = None
        if live.rec.state is WorkloadState.QUEUED:
            # Only this workload's entry: building every entry costs an ETA per queued workload.
            found = scheduling.queue_position(self, live.rec.id)
            if found is not None:
                pos, tpos, eta = found
        return status_of(live.rec, live.message, tuple(live.allocations), pos, tpos, eta)

    def _status_of_record(self, rec: WorkloadRecord) -> WorkloadStatus:
        return status_of(rec, rec.message)

    def grace_for(self, kind: str) -> timedelta:
        notice = self._preemption.notice("", WorkloadKind(kind), 0.0)
        return timedelta(seconds=notice.deadline_at)


def _device_uuids(node: Node, p: Placement) -> tuple[str, ...]:
    """The UUIDs a process uses to see ``p``'s devices: the MIG instance's own when the
    inventory knows it (an existing instance discovered with its UUID), else the GPUs'."""
    if p.mig_profile is not None and not p.mig_created:
        (g,) = p.gpus
        for inst in node.gpus[g].mig_layout:
            if inst.start == p.mig_start and inst.profile == p.mig_profile and inst.uuid:
                return (inst.uuid,)
    return tuple(node.gpus[g].uuid for g in p.gpus)
