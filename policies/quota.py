"""Quota: guaranteed and limit per tenant and flavor, borrowing within cohorts, reclaim.

Each tenant has, per flavor, a ``guaranteed`` amount and a ``limit`` (in the flavor's unit:
GPUs, MIG instances or milli-GPU). The rules, per flavor:

1. A tenant may always use up to its ``guaranteed``; nobody else can keep it from doing so for
   longer than one reclaim (preempting borrowers, see ``reclaim_plan``).
2. Above ``guaranteed`` and up to ``limit`` a tenant *borrows*, from two pools:

   - the **unguaranteed pool**: capacity nobody is guaranteed, ``max(0, capacity - Σ guaranteed)``
     over all tenants; every tenant may borrow from it;
   - its **cohort's unused guaranteed**: ``Σ max(0, guaranteed - used)`` over the members of its
     cohort. Tenants without a cohort only borrow from the unguaranteed pool; nothing is lent
     across cohorts.

3. A tenant never goes above its ``limit`` through admission, and the pools never lend more than
   they hold. Borrowed capacity is fungible: a cohort as a whole *draws*
   ``max(0, used_cohort - guaranteed_cohort)`` from the unguaranteed pool (a tenant without a
   cohort counts as a cohort of one), and the sum of the draws, ``drawn``, stays at most the
   unguaranteed pool. An admission is refused when it would raise ``drawn`` above the pool.
4. A request entirely within the tenant's guaranteed that is refused because borrowers hold the
   capacity is *reclaimable*: ``reclaim_plan`` says how much each borrower gives back, first the
   borrowers of the tenant's own cohort, then those drawing on the unguaranteed pool, then (only
   for a capacity shortfall) any other borrower; within each group the biggest borrower relative
   to its weight first. A request that would itself borrow never preempts anybody.
5. Lowering a quota below current usage is allowed and kills nothing: ``over_quota`` lists the
   excess, new work of that tenant is refused, and its usage above its (new) guaranteed counts
   as borrowed, hence reclaimable by others.
6. Capacity is checked too (``Σ used + amount <= capacity``). While ``capacity >= Σ guaranteed``
   the quota rules already imply it; when capacity drops below the guarantees (a node is down)
   a guaranteed request may wait for capacity (reason ``capacity``).

Cost: ``admit`` and ``reclaim_plan`` do O(tenants in the book) integer arithmetic on an index
the book builds once; they never look at workloads. Budgets are checked separately with
``budget_exhausted`` (the engine knows the GPU-hours used).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import StrEnum
from types import MappingProxyType

from policies import mig
from policies.errors import InvalidRequest, NotFound
from policies.flavors import MILLI_PER_GPU, Flavor, FlavorKind

MAX_QUANTITY = 10**9
MAX_WEIGHT = 1000.0

_DNS_LABEL_RE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_LABEL_VALID = (
    "a DNS-1123 label, Kubernetes namespace-compatible: 1 to 63 characters of lowercase a-z, "
    "0-9 or '-', starting and ending with a letter or digit"
)

Usage = Mapping[tuple[str, str], int]
"""(tenant, flavor) -> amount held (running plus being preempted), in the flavor's unit."""


class QueueReason(StrEnum):
    """Why a workload waits. Shared with the allocator engine and shown to people."""

    QUOTA = "quota"
    CAPACITY = "capacity"
    TOPOLOGY = "topology"
    BUDGET = "budget"


def validate_tenant_name(name: object, what: str = "tenant") -> str:
    """Return ``name`` if it is a DNS-1123 label (so it can name a Kubernetes namespace)."""
    if not isinstance(name, str) or not _DNS_LABEL_RE.fullmatch(name):
        raise InvalidRequest(what, repr(name), _DNS_LABEL_VALID)
    return name


def validate_flavor_name(name: object) -> Flavor:
    """Parse a flavor name; MIG profiles must exist for their model."""
    if not isinstance(name, str):
        raise InvalidRequest("flavor", repr(name), "a flavor name such as 'H100-80GB'")
    flavor = Flavor.parse(name)
    if flavor.kind is FlavorKind.MIG:
        assert flavor.profile is not None
        mig.geometry(flavor.model).profile(flavor.profile)
    return flavor


def _quantity(what: str, value: object, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_QUANTITY:
        raise InvalidRequest(what, value, f"an integer from {low} to {MAX_QUANTITY}")
    return value


def gpu_equivalent(flavor: Flavor, amount: int) -> float:
    """GPU-equivalents of ``amount`` units of ``flavor``.

    A GPU is 1; a MIG instance is its compute slices over the model's compute slices
    (``H100-80GB/3g.40gb``: 3/7); a share is milli-GPU / 1000.
    """
    if flavor.kind is FlavorKind.GPU:
        return float(amount)
    if flavor.kind is FlavorKind.MIG:
        assert flavor.profile is not None
        return amount * mig.geometry(flavor.model).gpu_equivalent(flavor.profile)
    return amount / MILLI_PER_GPU


@dataclass(frozen=True, slots=True)
class FlavorQuota:
    """One tenant's quota for one flavor.

    Attributes:
        guaranteed: always available to the tenant (reclaimed from borrowers when needed).
        limit: the most the tenant may hold; ``limit - guaranteed`` is what it may borrow.
        budget_gpu_hours: GPU-hours per budget period, or ``None`` for no budget.
    """

    guaranteed: int
    limit: int
    budget_gpu_hours: float | None = None

    def __post_init__(self) -> None:
        _quantity("guaranteed quota", self.guaranteed)
        _quantity("quota limit", self.limit)
        if self.limit < self.guaranteed:
            raise InvalidRequest(
                "quota limit", self.limit, f"at least the guaranteed quota ({self.guaranteed})"
            )
        budget = self.budget_gpu_hours
        if budget is not None and (
            isinstance(budget, bool)
            or not isinstance(budget, int | float)
            or not math.isfinite(budget)
            or not 0 <= budget <= MAX_QUANTITY
        ):
            raise InvalidRequest(
                "budget_gpu_hours",
                budget,
                f"none, or a number of GPU-hours from 0 to {MAX_QUANTITY}",
            )


@dataclass(frozen=True, slots=True)
class TenantQuota:
    """A tenant's quotas by flavor name, its cohort (``None``: lends and borrows with nobody)
    and its fair-share weight in (0, 1000]."""

    tenant: str
    quotas: Mapping[str, FlavorQuota]
    cohort: str | None = None
    weight: float = 1.0

    def __post_init__(self) -> None:
        validate_tenant_name(self.tenant)
        if self.cohort is not None:
            validate_tenant_name(self.cohort, "cohort")
        w = self.weight
        if (
            isinstance(w, bool)
            or not isinstance(w, int | float)
            or not math.isfinite(w)
            or not 0 < w <= MAX_WEIGHT
        ):
            raise InvalidRequest("weight", w, f"a number > 0 and <= {MAX_WEIGHT:g}")
        for name, quota in self.quotas.items():
            validate_flavor_name(name)
            if not isinstance(quota, FlavorQuota):
                raise InvalidRequest(f"quota for {name}", repr(quota), "a FlavorQuota")
        object.__setattr__(self, "quotas", MappingProxyType(dict(self.quotas)))


@dataclass(frozen=True, slots=True)
class _Member:
    tenant: str
    guaranteed: int
    limit: int
    weight: float
    has_quota: bool


@dataclass(frozen=True, slots=True)
class _Group:
    """A cohort, or a tenant without a cohort (a cohort of one)."""

    cohort: str | None
    members: tuple[_Member, ...]
    guaranteed: int


@dataclass(frozen=True, slots=True)
class _FlavorIndex:
    flavor: Flavor
    capacity: int
    guaranteed_total: int
    unguaranteed: int
    groups: tuple[_Group, ...]
    where: Mapping[str, tuple[int, _Member]]


@dataclass(frozen=True, slots=True)
class QuotaBook:
    """All tenants' quotas and the capacity per flavor (what the cluster has right now).

    Immutable; ``with_tenant``/``without_tenant``/``with_capacity`` return changed copies.
    """

    tenants: Mapping[str, TenantQuota]
    capacity: Mapping[str, int]
    _index: Mapping[str, _FlavorIndex] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for key, tq in self.tenants.items():
            if not isinstance(tq, TenantQuota) or key != tq.tenant:
                raise InvalidRequest("tenant entry", repr(key), "a TenantQuota under its own name")
        for name, amount in self.capacity.items():
            validate_flavor_name(name)
            _quantity(f"capacity of {name}", amount)
        object.__setattr__(self, "tenants", MappingProxyType(dict(self.tenants)))
        object.__setattr__(self, "capacity", MappingProxyType(dict(self.capacity)))
        flavors = set(self.capacity)
        for tq in self.tenants.values():
            flavors.update(tq.quotas)
        object.__setattr__(
            self, "_index", MappingProxyType({f: self._build(f) for f in sorted(flavors)})
        )

    def _build(self, flavor: str) -> _FlavorIndex:
        by_group: dict[str, list[_Member]] = {}
        for name in sorted(self.tenants):
            tq = self.tenants[name]
            q = tq.quotas.get(flavor)
            member = _Member(
                name, q.guaranteed if q else 0, q.limit if q else 0, tq.weight, q is not None
            )
            key = f"c/{tq.cohort}" if tq.cohort is not None else f"t/{name}"
            by_group.setdefault(key, []).append(member)
        groups: list[_Group] = []
        where: dict[str, tuple[int, _Member]] = {}
        for key in sorted(by_group):
            members = tuple(by_group[key])
            for m in members:
                where[m.tenant] = (len(groups), m)
            cohort = key[2:] if key.startswith("c/") else None
            groups.append(_Group(cohort, members, sum(m.guaranteed for m in members)))
        total = sum(g.guaranteed for g in groups)
        capacity = self.capacity.get(flavor, 0)
        return _FlavorIndex(
            Flavor.parse(flavor), capacity, total, max(0, capacity - total), tuple(groups), where
        )

    @property
    def flavors(self) -> list[str]:
        """Every flavor with capacity or a quota."""
        return list(self._index)

    def with_tenant(self, quota: TenantQuota) -> QuotaBook:
        """A copy with ``quota`` added or replacing the tenant's current quota."""
        return replace(self, tenants={**self.tenants, quota.tenant: quota})

    def without_tenant(self, tenant: str) -> QuotaBook:
        self._tenant(tenant)
        return replace(self, tenants={k: v for k, v in self.tenants.items() if k != tenant})

    def with_capacity(self, capacity: Mapping[str, int]) -> QuotaBook:
        return replace(self, capacity=capacity)

    def _tenant(self, tenant: str) -> TenantQuota:
        try:
            return self.tenants[tenant]
        except KeyError:
            raise NotFound("tenant", tenant, list(self.tenants)) from None

    def _flavor(self, flavor: str) -> _FlavorIndex:
        try:
            return self._index[flavor]
        except KeyError:
            raise NotFound("flavor", flavor, list(self._index)) from None


@dataclass(frozen=True, slots=True)
class Admission:
    """The quota decision for one request.

    Attributes:
        ok: admitted (quota and total capacity allow it; placement may still fail).
        borrowed: the part of the request beyond the tenant's guaranteed.
        reason: why not, or ``None`` when ok.
        message: a sentence for people.
        reclaimable: how much of ``shortfall`` reclaiming borrowed quota from others would
            free (0 for a request that would itself borrow). Reclaiming makes the request
            admissible exactly when ``reclaimable >= shortfall``.
        shortfall: how much is missing (0 when ok).
    """

    ok: bool
    borrowed: int
    reason: QueueReason | None
    message: str
    reclaimable: int = 0
    shortfall: int = 0


@dataclass(frozen=True, slots=True)
class FlavorUsage:
    """One line of a tenant's usage: ``lent`` is how much of its unused guaranteed other
    members of its cohort are using right now."""

    flavor: str
    guaranteed: int
    limit: int
    used: int
    borrowed: int
    lent: int


@dataclass(frozen=True, slots=True)
class PoolUsage:
    """The borrowing state of one flavor: ``drawn <= unguaranteed`` unless an admin change or a
    capacity loss over-committed it."""

    flavor: str
    capacity: int
    guaranteed: int
    unguaranteed: int
    drawn: int
    used: int


@dataclass(slots=True)
class _State:
    """Per-flavor aggregates of one usage snapshot."""

    group_used: list[int]
    drawn: int
    used: int


def _state(idx: _FlavorIndex, usage: Usage, flavor: str) -> _State:
    group_used = []
    drawn = 0
    for group in idx.groups:
        u = sum(usage.get((m.tenant, flavor), 0) for m in group.members)
        group_used.append(u)
        drawn += max(0, u - group.guaranteed)
    return _State(group_used, drawn, sum(group_used))


def pool_usage(book: QuotaBook, usage: Usage, flavor: str) -> PoolUsage:
    """Capacity, guarantees and borrowing of one flavor, for dashboards and checks."""
    idx = book._flavor(flavor)
    st = _state(idx, usage, flavor)
    return PoolUsage(
        flavor, idx.capacity, idx.guaranteed_total, idx.unguaranteed, st.drawn, st.used
    )


def admit(book: QuotaBook, usage: Usage, tenant: str, flavor: str, amount: int) -> Admission:
    """Decide whether ``tenant`` may take ``amount`` more of ``flavor`` (see the module rules)."""
    return _decide(book, usage, None, tenant, flavor, amount)[0]


def reclaim_plan(
    book: QuotaBook,
    usage: Usage,
    borrowed_by_tenant: Mapping[str, int] | None,
    tenant: str,
    flavor: str,
    amount: int,
) -> dict[str, int]:
    """How much each borrower must give back so that ``tenant`` gets ``amount`` of ``flavor``.

    Args:
        borrowed_by_tenant: the most that may be reclaimed from each tenant (for example its
            borrowed work not already being preempted); ``None`` means everything it holds
            above its guaranteed. A tenant is never asked for more than it holds above its
            guaranteed.

    Returns:
        tenant -> amount; empty when the request is admissible as is, would itself borrow, or
        cannot be made admissible by reclaiming.
    """
    decision, plan = _decide(book, usage, borrowed_by_tenant, tenant, flavor, amount)
    if decision.ok or decision.reclaimable < decision.shortfall:
        return {}
    return plan


def _decide(
    book: QuotaBook,
    usage: Usage,
    caps: Mapping[str, int] | None,
    tenant: str,
    flavor: str,
    amount: int,
) -> tuple[Admission, dict[str, int]]:
    book._tenant(tenant)
    idx = book._flavor(flavor)
    _quantity("requested amount", amount, low=1)
    gi, me = idx.where[tenant]
    unit = idx.flavor.unit
    if not me.has_quota:
        msg = f"{tenant} has no quota for {flavor}; ask a tenant admin to add one"
        return Admission(False, 0, QueueReason.QUOTA, msg, 0, amount), {}
    used = usage.get((tenant, flavor), 0)
    after = used + amount
    borrowed = max(0, after - me.guaranteed) - max(0, used - me.guaranteed)
    if _over_own_limit(me, used, amount):
        msg = (
            f"{tenant} quota for {flavor}: {used}/{me.limit} {unit} in use, {amount} requested "
            f"(limit {me.limit})"
        )
        return Admission(False, borrowed, QueueReason.QUOTA, msg, 0, after - me.limit), {}
    st = _state(idx, usage, flavor)
    group = idx.groups[gi]
    gu = st.group_used[gi]
    draw_before = max(0, gu - group.guaranteed)
    draw_after = max(0, gu + amount - group.guaranteed)
    drawn_after = st.drawn - draw_before + draw_after
    short_q = 0 if draw_after == draw_before else max(0, drawn_after - idx.unguaranteed)
    free = max(0, idx.capacity - st.used)
    short_c = max(0, amount - free)
    if not short_q and not short_c:
        return Admission(True, borrowed, None, "admitted"), {}
    shortfall = max(short_q, short_c)
    reason = QueueReason.QUOTA if short_q else QueueReason.CAPACITY
    if borrowed:
        slack = max(0, group.guaranteed - gu) + max(0, idx.unguaranteed - st.drawn)
        if short_q:
            msg = (
                f"{tenant} would borrow {borrowed} {unit} of {flavor} beyond its guaranteed "
                f"{me.guaranteed}, but {'its cohort and ' if group.cohort else ''}the "
                f"unguaranteed capacity can lend only {slack} now"
            )
            if free >= amount:
                # The idle-tenant case: devices stand free, and still it waits.
                msg += (
                    f"; {free} {unit} of {flavor} stand free, but they are other tenants' "
                    f"guaranteed quota, which {tenant} may not borrow (tenants lend only "
                    "within their cohort); it waits for a release"
                )
        else:
            msg = f"{flavor}: {free}/{idx.capacity} {unit} free, {amount} requested"
        return Admission(False, borrowed, reason, msg, 0, shortfall), {}
    plan = _plan(idx, usage, flavor, caps, st, gi, tenant, draw_after, short_q, short_c)
    got = sum(plan.values())
    if short_q:
        msg = (
            f"{tenant}'s guaranteed {me.guaranteed} {unit} of {flavor} is lent to borrowers; "
            f"{got} of the missing {shortfall} can be reclaimed"
        )
    else:
        msg = (
            f"{flavor}: {free}/{idx.capacity} {unit} free, {amount} requested; "
            f"{got} of the missing {shortfall} can be reclaimed from borrowers"
        )
    return Admission(False, 0, reason, msg, got, shortfall), plan


def _plan(
    idx: _FlavorIndex,
    usage: Usage,
    flavor: str,
    caps: Mapping[str, int] | None,
    st: _State,
    gi: int,
    tenant: str,
    own_draw: int,
    short_q: int,
    short_c: int,
) -> dict[str, int]:
    """Greedy reclaim: units that reduce the pool draw first (own cohort, then others), then,
    for a capacity shortfall only, any remaining borrowed units (own cohort, then others)."""
    # (order key, tenant, group index, reclaimable); order: own cohort first, then the biggest
    # borrower relative to its weight, then the name.
    borrowers: list[tuple[tuple[int, float, str], str, int, int]] = []
    for i, group in enumerate(idx.groups):
        for m in group.members:
            if m.tenant == tenant:
                continue
            over = usage.get((m.tenant, flavor), 0) - m.guaranteed
            cap = over if caps is None else min(over, caps.get(m.tenant, 0))
            if cap > 0:
                borrowers.append(((i != gi, -over / m.weight, m.tenant), m.tenant, i, cap))
    borrowers.sort()
    group_draw = [max(0, u - g.guaranteed) for u, g in zip(st.group_used, idx.groups, strict=True)]
    group_draw[gi] = own_draw
    left = {b[1]: b[3] for b in borrowers}
    plan: dict[str, int] = {}
    need = max(short_q, short_c)
    for _, name, i, _cap in borrowers:
        take = min(need, left[name], group_draw[i])
        if take > 0:
            plan[name] = plan.get(name, 0) + take
            left[name] -= take
            group_draw[i] -= take
            need -= take
    if sum(plan.values()) < short_q:
        return plan
    for _, name, _i, _cap in borrowers:
        take = min(need, left[name])
        if take > 0:
            plan[name] = plan.get(name, 0) + take
            left[name] -= take
            need -= take
    return plan


def _over_own_limit(me: _Member, used: int, amount: int) -> bool:
    return used + amount > me.limit


def own_limit_refuses(book: QuotaBook, usage: Usage, tenant: str, flavor: str, amount: int) -> bool:
    """Whether ``admit`` refuses ``amount`` of ``flavor`` by the tenant's own quota (none, or
    its limit) whatever the other tenants hold: a verdict only the tenant's own usage or its
    quota can change."""
    me = book._flavor(flavor).where[tenant][1]
    return not me.has_quota or _over_own_limit(me, usage.get((tenant, flavor), 0), amount)


def affected_by_release(
    book: QuotaBook, usage: Usage, tenant: str, flavor: str
) -> frozenset[str] | None:
    """Tenants whose admission of ``flavor`` can change when ``tenant`` holds less of it.

    ``usage`` is the state before the release. A release changes the tenant's own usage and
    its group's draw on the unguaranteed pool: if the group was within its guaranteed total,
    the pool is untouched and only the group's members can be affected; if it was drawing on
    the pool, anyone borrowing from the pool may now fit, so ``None`` (everyone). Free capacity
    changes for everyone either way; callers retry capacity-blocked work separately.
    """
    idx = book._flavor(flavor)
    gi, _ = idx.where[tenant]
    group = idx.groups[gi]
    used = sum(usage.get((m.tenant, flavor), 0) for m in group.members)
    if used > group.guaranteed:
        return None
    return frozenset(m.tenant for m in group.members)


def usage_summary(book: QuotaBook, usage: Usage, tenant: str) -> list[FlavorUsage]:
    """The tenant's guaranteed, limit, used, borrowed and lent per flavor it has quota or
    usage for, sorted by flavor."""
    tq = book._tenant(tenant)
    rows = []
    for flavor, idx in book._index.items():
        gi, me = idx.where[tenant]
        used = usage.get((tenant, flavor), 0)
        if flavor not in tq.quotas and not used:
            continue
        rows.append(
            FlavorUsage(
                flavor,
                me.guaranteed,
                me.limit,
                used,
                max(0, used - me.guaranteed),
                _lent(idx.groups[gi], usage, flavor, tenant),
            )
        )
    return rows


def _lent(group: _Group, usage: Usage, flavor: str, tenant: str) -> int:
    """The tenant's part of the cohort's unused guaranteed that cohort borrowers use now,
    split in proportion to unused guaranteed (largest remainder, ties by name)."""
    if group.cohort is None:
        return 0
    unused: dict[str, int] = {}
    borrowed = 0
    for m in group.members:
        u = usage.get((m.tenant, flavor), 0)
        unused[m.tenant] = max(0, m.guaranteed - u)
        borrowed += max(0, u - m.guaranteed)
    total_unused = sum(unused.values())
    lent_total = min(borrowed, total_unused)
    if not lent_total or not unused[tenant]:
        return 0
    shares = {t: divmod(lent_total * v, total_unused) for t, v in unused.items()}
    rest = lent_total - sum(q for q, _ in shares.values())
    extra = sorted(shares, key=lambda t: (-shares[t][1], t))[:rest]
    return shares[tenant][0] + (1 if tenant in extra else 0)


def over_quota(book: QuotaBook, usage: Usage) -> list[tuple[str, str, int]]:
    """(tenant, flavor, excess) for every usage above its limit (after an admin lowered a
    quota, or for tenants and flavors without a quota), sorted."""
    out = []
    for (tenant, flavor), used in usage.items():
        tq = book.tenants.get(tenant)
        q = tq.quotas.get(flavor) if tq is not None else None
        limit = q.limit if q is not None else 0
        if used > limit:
            out.append((tenant, flavor, used - limit))
    return sorted(out)


def budget_exhausted(quota: FlavorQuota, gpu_hours_used_this_period: float) -> bool:
    """Whether the period's GPU-hour budget is used up (never, without a budget). New work of
    this flavor then waits with reason ``budget``; running work is left alone."""
    budget = quota.budget_gpu_hours
    return budget is not None and gpu_hours_used_this_period >= budget
