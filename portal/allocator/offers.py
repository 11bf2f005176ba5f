"""Offers: what a tenant could ask for right now, and what would happen if it did.

The catalogue (``catalogue``) lists the options the inventory supports: one whole GPU of each
model, 2/4/8 GPUs of a model on one node (NVLink-connected where the nodes have NVLink), each
MIG profile, quarter and half shares of shareable models, and CPU only. ``offers`` decides each
option for one tenant on the allocator's state, under its lock, changing nothing:

- ``not_allowed``: the tenant can never get it as things stand: no quota for the flavor, a
  request above its limit, or no node of that model in the tenant's node pools;
- ``available``: quota admits it and placement finds devices now (respecting the node reserved
  for the head of the queue), so a request would start at once;
- ``queued``: a request would wait, with the reason the scheduler would give (``quota``,
  ``capacity``, ``topology``, ``budget``), its sentence, the position and tenant position it
  would get, and an estimated wait.

The same rules as the scheduling cycle (``admission.try_start``) are used, so an offer and the
answer to the request made from it agree unless something changes in between.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import TYPE_CHECKING

from policies import quota
from policies.errors import InvalidRequest
from policies.flavors import MILLI_PER_GPU, Flavor, FlavorKind
from policies.inventory import Node
from policies.placement.fork import ClusterFork
from policies.placement.framework import PlacementContext
from policies.placement.gangs import place_gang
from policies.placement.pipeline import NoFit
from policies.requests import DeviceRequest, TopologyRequirement, WorkloadRequest
from policies.topology import LinkClass
from portal.allocator import estimates
from portal.allocator.admission import budget_message
from portal.allocator.memory import Live, Memory
from portal.store.records import WorkloadRecord, WorkloadState

if TYPE_CHECKING:
    from portal.allocator.engine import Allocator

MULTI_GPU_COUNTS = (2, 4, 8)
SHARE_MILLI = (250, 500)
CPU_ONLY = "cpu"
_AFTER_EVERYONE = 2**62  # the arrival sequence of a request that is not made


class OfferState(StrEnum):
    AVAILABLE = "available"
    QUEUED = "queued"
    NOT_ALLOWED = "not_allowed"


class NotAllowedReason(StrEnum):
    """Why an option is refused outright (queue reasons are ``policies.quota.QueueReason``)."""

    NO_QUOTA = "no-quota"
    OVER_LIMIT = "over-limit"
    NOT_IN_POOL = "not-in-pool"


@dataclass(frozen=True, slots=True)
class Option:
    """One thing a person may pick. ``key`` is stable (``gpu:H100-80GB:1``,
    ``gpu:H100-80GB:4``, ``mig:H100-80GB:3g.40gb``, ``share:T4:250``, ``cpu``); ``label`` is
    what the form shows; ``flavor`` is the quota flavor (None for CPU only)."""

    key: str
    label: str
    devices: DeviceRequest
    flavor: str | None

    @property
    def model(self) -> str | None:
        return next(iter(self.devices.models), None)


@dataclass(frozen=True, slots=True)
class Offer:
    """An option decided for one tenant. ``reason``/``message`` are set unless available;
    ``position`` (1-based, whole queue), ``tenant_position`` and ``eta_s`` (None: unknown)
    only when queued."""

    option: Option
    state: OfferState
    reason: str = ""
    message: str = ""
    position: int | None = None
    tenant_position: int | None = None
    eta_s: float | None = None


def catalogue(nodes: Iterable[Node]) -> list[Option]:
    """Every option the inventory supports, CPU only last. Pure."""
    whole: dict[str, int] = {}  # model -> most whole GPUs of it on one node
    nvlink: set[str] = set()
    memory: dict[str, int] = {}
    shareable: set[str] = set()
    mig_profiles: set[tuple[str, str]] = set()
    for node in nodes:
        per_model: dict[str, list[int]] = {}
        for g in node.gpus:
            memory[g.model] = max(memory.get(g.model, 0), g.memory_mib)
            if g.mig_enabled:
                mig_profiles.update((g.model, i.profile) for i in g.mig_layout)
                continue
            per_model.setdefault(g.model, []).append(g.index)
            if g.shareable:
                shareable.add(g.model)
        topo = node.link_topology
        for model, idx in per_model.items():
            whole[model] = max(whole.get(model, 0), len(idx))
            if any(topo.link(i, j) >= LinkClass.NVLINK for i in idx for j in idx if i < j):
                nvlink.add(model)
    out: list[Option] = []
    for model in sorted(whole):
        out.append(Option(f"gpu:{model}:1", f"1 × {model}", _gpu(model, 1), model))
        for n in MULTI_GPU_COUNTS:
            if n <= whole[model]:
                linked = model in nvlink
                label = f"{n} × {model}" + (" NVLink" if linked else "")
                out.append(Option(f"gpu:{model}:{n}", label, _gpu(model, n, linked), model))
    for model, profile in sorted(mig_profiles):
        dev = DeviceRequest(FlavorKind.MIG, 1, frozenset({model}), mig_profile=profile)
        flavor = str(Flavor(FlavorKind.MIG, model, profile))
        out.append(Option(f"mig:{model}:{profile}", f"MIG {profile} on {model}", dev, flavor))
    for model in sorted(shareable):
        for milli in SHARE_MILLI:
            mem = memory[model] * milli // MILLI_PER_GPU
            dev = DeviceRequest(FlavorKind.SHARE, 1, frozenset({model}), milli=milli,
                                gpu_memory_mib=mem)  # fmt: skip
            label = f"{milli / MILLI_PER_GPU:g} × {model} ({mem // 1024} GiB)"
            flavor = str(Flavor(FlavorKind.SHARE, model))
            out.append(Option(f"share:{model}:{milli}", label, dev, flavor))
    out.append(Option(CPU_ONLY, "CPU only", DeviceRequest(), None))
    return out


def _gpu(model: str, count: int, nvlink: bool = False) -> DeviceRequest:
    topology = TopologyRequirement.NVLINK if nvlink else TopologyRequirement.ANY
    return DeviceRequest(FlavorKind.GPU, count, frozenset({model}), topology=topology)


def find(options: Iterable[Option], key: str) -> Option:
    """The option named ``key``; raises ``InvalidRequest`` naming the valid keys."""
    by_key = {o.key: o for o in options}
    try:
        return by_key[key]
    except KeyError:
        raise InvalidRequest("GPU option", repr(key), "one of " + ", ".join(by_key)) from None


def offers(
    alloc: Allocator,
    tenant: str,
    options: Iterable[Option] | None = None,
    *,
    keys: frozenset[str] | None = None,
) -> list[Offer]:
    """Decide every option (default: the inventory's catalogue) for ``tenant``; only those
    named in ``keys`` when given (unknown keys are skipped).

    Raises:
        NotFound: no such tenant.
    """
    now = alloc.clock()
    return alloc.read(lambda state: _decide_all(alloc, state, tenant, options, keys, now))


@dataclass(slots=True)
class _Cached:
    """What offers derive from the inventory alone, for one inventory version."""

    capacity: dict[str, int]  # the state's capacity dict: replaced on every inventory change
    options: list[Option]
    reachable: dict[frozenset[str], frozenset[str]]


# Per allocator: rebuilding the catalogue walks every node (tens of ms at 10,000 GPUs), while
# the inventory changes rarely. Weak keys: the cache never keeps an allocator alive.
_cache: weakref.WeakKeyDictionary[Allocator, _Cached] = weakref.WeakKeyDictionary()


def _inventory_view(alloc: Allocator, state: Memory) -> _Cached:
    """The cached catalogue for the current inventory (call under the allocator's lock)."""
    got = _cache.get(alloc)
    capacity = state.capacity()
    if got is None or got.capacity is not capacity:
        got = _Cached(capacity, catalogue(state.nodes.values()), {})
        _cache[alloc] = got
    return got


def _decide_all(
    alloc: Allocator,
    state: Memory,
    tenant: str,
    options: Iterable[Option] | None,
    keys: frozenset[str] | None,
    now: datetime,
) -> list[Offer]:
    rec = state.tenant(tenant)
    view = _inventory_view(alloc, state)
    opts = list(options) if options is not None else view.options
    if keys is not None:
        opts = [o for o in opts if o.key in keys]
    ctx = PlacementContext(pools=frozenset(rec.pools), avoid=state.scalars.reserved)
    reachable = view.reachable.get(ctx.pools)
    if reachable is None:
        reachable = view.reachable[ctx.pools] = _models_in_pools(state.nodes.values(), ctx.pools)
    return [_decide(state, tenant, o, ctx, reachable, now) for o in opts]


def _models_in_pools(nodes: Iterable[Node], pools: frozenset[str]) -> frozenset[str]:
    """Models on nodes the tenant may use (nodes without a pool are open to every tenant)."""
    return frozenset(m for n in nodes if not n.pool or n.pool in pools for m in n.models)


def _decide(
    state: Memory,
    tenant: str,
    option: Option,
    ctx: PlacementContext,
    reachable: frozenset[str],
    now: datetime,
) -> Offer:
    dev = option.devices
    model = option.model
    if model is not None and model not in reachable:
        return Offer(
            option,
            OfferState.NOT_ALLOWED,
            NotAllowedReason.NOT_IN_POOL.value,
            f"no {model} node is in {tenant}'s node pools",
        )
    blocked: str = ""
    message = ""
    fl = option.flavor
    if fl is not None:
        q = state.quotas.get((tenant, fl))
        amount = dev.amount()
        if q is None or q.limit == 0:
            return Offer(
                option,
                OfferState.NOT_ALLOWED,
                NotAllowedReason.NO_QUOTA.value,
                f"{tenant} has no quota for {fl}; ask a tenant admin to add one",
            )
        if amount > q.limit:
            return Offer(
                option,
                OfferState.NOT_ALLOWED,
                NotAllowedReason.OVER_LIMIT.value,
                f"{option.label} needs {amount} {Flavor.parse(fl).unit} of {fl}; "
                f"{tenant}'s limit is {q.limit}",
            )
        if not state.budget_ok(tenant, fl, now):
            blocked = quota.QueueReason.BUDGET.value
            message = budget_message(tenant, fl)
        else:
            adm = quota.admit(state.book(), state.ledger.usage, tenant, fl, amount)
            if not adm.ok:
                blocked = adm.reason.value if adm.reason else quota.QueueReason.QUOTA.value
                message = adm.message
    if not blocked:
        # On a working copy: placing a gang tries placements, and the live state must not move.
        got = place_gang(dev, 1, ClusterFork(state.cluster), state.policy, ctx)
        if not isinstance(got, NoFit):
            return Offer(option, OfferState.AVAILABLE)
        reason = quota.QueueReason.TOPOLOGY if got.topology else quota.QueueReason.CAPACITY
        blocked, message = reason.value, got.summary()
    position, tenant_position, eta = _would_queue(state, tenant, option, blocked, now)
    return Offer(option, OfferState.QUEUED, blocked, message, position, tenant_position, eta)


def _would_queue(
    state: Memory, tenant: str, option: Option, reason: str, now: datetime
) -> tuple[int, int, float | None]:
    """Position, tenant position and ETA a request for ``option`` would get if queued now."""
    ordered = state.order(now)
    mine = state.share(tenant, now)
    shares: dict[str, float] = {}
    ahead: list[Live] = []
    for lv in ordered:
        if lv.rec.priority < 0:
            break  # a new request (priority 0) goes before every negative priority
        t = lv.rec.tenant
        if lv.rec.priority == 0:
            if t not in shares:
                shares[t] = state.share(t, now)
            if shares[t] > mine and t != tenant:
                break
        ahead.append(lv)
    position = len(ahead) + 1
    tenant_position = sum(1 for lv in ahead if lv.rec.tenant == tenant) + 1
    probe = Live(
        WorkloadRecord(
            id="offer",
            tenant=tenant,
            owner="",
            name=option.key,
            kind="notebook",
            request={},
            gang_size=1,
            priority=0,
            state=WorkloadState.QUEUED,
            created_at=now,
            reason=reason,
        ),
        WorkloadRequest(tenant=tenant, owner="offer", name=option.key, devices=option.devices),
        seq=_AFTER_EVERYONE,
    )
    eta = estimates.eta(state, probe, ahead, now) if option.flavor is not None else None
    return position, tenant_position, eta


__all__ = [
    "CPU_ONLY",
    "NotAllowedReason",
    "Offer",
    "OfferState",
    "Option",
    "catalogue",
    "find",
    "offers",
]
