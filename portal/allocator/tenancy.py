"""Tenants and their quotas, as the allocator keeps them: set through the single writer path
(decide on a draft, commit, apply) with optimistic versions, read from the live state.

``TenantsAndQuotas`` is a base of ``portal.allocator.engine.Allocator``.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies import quota
from policies.errors import Conflict, Forbidden, InvalidRequest
from policies.flavors import Flavor
from portal.allocator import checks, cycle
from portal.allocator.draft import Draft
from portal.allocator.group_commit import GroupCommit
from portal.allocator.ops import PutQuota, PutTenant
from portal.store.records import QuotaRecord, TenantRecord


class TenantsAndQuotas(GroupCommit):
    """Setting and listing tenants and quotas; thread-safe like the rest of the allocator."""

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
        quota.validate_tenant_name(name)
        pools = tuple(sorted(set(pools)))

        def decide(draft: Draft) -> TenantRecord:
            old = draft.tenants.get(name)
            _check_version("tenant", name, old.version if old else None, expected_version)
            rec = TenantRecord(name, cohort, float(weight), pools, (old.version + 1) if old else 1)
            quota.TenantQuota(tenant=name, quotas={}, cohort=cohort, weight=rec.weight)
            draft.do(PutTenant(rec))
            draft.event("tenant.set", name, None, f"tenant {name} set", {"cohort": cohort})
            cycle.schedule(draft)
            return rec

        return self._decide(decide)

    def set_quota(
        self,
        tenant: str,
        flavor: str,
        *,
        guaranteed: int,
        limit: int,
        budget_gpu_hours: float | None = None,
        ceiling_guaranteed: int | None = None,
        ceiling_limit: int | None = None,
        overcommit: bool = False,
        within_ceiling: bool = False,
        expected_version: int | None = None,
    ) -> QuotaRecord:
        """Set a tenant's quota for a flavor. Lowering it below usage stops nothing: it blocks
        new work and reclaims borrowed work by the normal preemption rules.

        Guarantees are the platform's to give (``docs/quota.md``):

        - ``within_ceiling`` (a tenant admin's edit): ``guaranteed`` and ``limit`` must stay
          within the quota's ceilings, which it cannot change, and it cannot over-commit
          (``Forbidden`` naming the ceiling);
        - otherwise (the platform admin's) the ceilings are set too: as given, else kept but
          raised to the new values;
        - raising ``guaranteed`` so that the flavor's guarantees add up to more than its
          capacity is refused (``InvalidRequest`` naming the sum, the capacity and the most
          that fits) unless ``overcommit`` (the platform admin's explicit choice; never with
          ``within_ceiling``). Every caller gets this check, in-process ones too: a promise
          that cannot be kept is not the platform's default.
        """
        fl = str(Flavor.parse(flavor))
        quota.FlavorQuota(guaranteed=guaranteed, limit=limit, budget_gpu_hours=budget_gpu_hours)
        if within_ceiling and (
            overcommit or ceiling_guaranteed is not None or ceiling_limit is not None
        ):
            raise Forbidden(
                f"only a platform admin may set the ceilings of {tenant}/{fl} or over-commit it"
            )
        for name, ceiling, value in (
            ("ceiling_guaranteed", ceiling_guaranteed, guaranteed),
            ("ceiling_limit", ceiling_limit, limit),
        ):
            if ceiling is not None and ceiling < value:
                raise InvalidRequest(name, ceiling, f">= {value}, the value it bounds")
        if (
            ceiling_guaranteed is not None
            and ceiling_limit is not None
            and ceiling_guaranteed > ceiling_limit
        ):
            raise InvalidRequest(
                "ceiling_guaranteed", ceiling_guaranteed, f"<= ceiling_limit {ceiling_limit}"
            )

        def decide(draft: Draft) -> QuotaRecord:
            draft.tenant(tenant)
            old = draft.quotas.get((tenant, fl))
            _check_version(
                "quota", f"{tenant}/{fl}", old.version if old else None, expected_version
            )
            had_g, had_l = (old.ceiling_guaranteed, old.ceiling_limit) if old else (0, 0)
            if within_ceiling:
                checks.within_ceiling(tenant, fl, guaranteed, limit, had_g, had_l)
                top_g, top_l = had_g, had_l
            else:
                top_g = (
                    ceiling_guaranteed if ceiling_guaranteed is not None else max(had_g, guaranteed)
                )
                top_l = ceiling_limit if ceiling_limit is not None else max(had_l, limit, top_g)
                top_g = min(top_g, top_l)  # a kept guaranteed ceiling above a new limit ceiling
            if guaranteed > (old.guaranteed if old else 0) and not overcommit:
                checks.guarantees_fit(draft, tenant, fl, guaranteed)
            rec = QuotaRecord(
                tenant,
                fl,
                guaranteed,
                limit,
                budget_gpu_hours,
                (old.version + 1) if old else 1,
                top_g,
                top_l,
            )
            draft.do(PutQuota(rec))
            draft.event(
                "quota.set",
                tenant,
                None,
                f"quota {tenant} {fl}: {guaranteed}/{limit} (ceilings {top_g}/{top_l})",
                {
                    "flavor": fl,
                    "guaranteed": guaranteed,
                    "limit": limit,
                    "ceiling_guaranteed": top_g,
                    "ceiling_limit": top_l,
                    "overcommit_allowed": overcommit,
                },
            )
            cycle.schedule(draft)
            return rec

        return self._decide(decide)

    def tenants(self) -> list[TenantRecord]:
        with self._lock:
            return sorted(self._state.tenants.values(), key=lambda t: t.name)

    def quotas(self, tenant: str | None = None) -> list[QuotaRecord]:
        with self._lock:
            return sorted(
                (q for q in self._state.quotas.values() if tenant is None or q.tenant == tenant),
                key=lambda q: (q.tenant, q.flavor),
            )


def _check_version(kind: str, name: str, current: int | None, expected: int | None) -> None:
    if expected is not None and expected != (current or 0):
        raise Conflict(
            f"{kind} {name} changed meanwhile: you read version {expected}, "
            f"it is now version {current or 0}; re-read it and apply your change again"
        )
