"""The seeded dataset every dashboard test reads: the demo inventory, two tenants in a cohort,
running and queued workloads, and hub identities for each kind of viewer.

Inventory (``portal/data/demo-inventory.yaml``): hgx-1 and hgx-2 (8 × H100-80GB each, NVSwitch),
a100-1 (4 × A100-80GB; GPU 0 and 1 MIG-partitioned: 3 and 5 instances), t4-1 and t4-2
(2 × T4 each, shareable): 24 GPUs.

Workloads, in order:

| owner | tenant | name | asks | result |
|---|---|---|---|---|
| alice | team-a | nb-alice | 1 × H100 | runs |
| alice | team-a | train-a | 4 × H100 | runs (team-a at 5 of guaranteed 4: 1 borrowed) |
| alice | team-a | infer-a | 250 milli T4 | runs |
| bob | team-b | nb-bob | 2 × H100 | runs |
| bob | team-b | mig-bob | A100 1g.10gb | runs |
| bob | team-b | train-b | 8 × H100 | queued: team-b's limit 8 < 2 + 8 (reason quota) |
"""

from __future__ import annotations

from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadKind, WorkloadRequest
from portal.allocator import Allocator
from portal.api.auth import Caller, CallerKind, Scope
from portal.inventory.simulated import load_demo

S = Scope
READ_ALL = (S.QUOTAS_READ, S.USAGE_READ, S.QUEUE_READ, S.WORKLOADS_READ, S.COST_READ)


def _user(name: str, groups: set[str], *scopes: str) -> Caller:
    return Caller(name, CallerKind.USER, frozenset(scopes), frozenset(groups))


def member_of(tenant: str) -> tuple[str, ...]:
    return (
        S.WORKLOADS_WRITE,
        f"{S.WORKLOADS_READ}!group={tenant}",
        f"{S.QUEUE_READ}!group={tenant}",
        f"{S.QUOTAS_READ}!group={tenant}",
        f"{S.USAGE_READ}!group={tenant}",
    )


def admin_of(tenant: str) -> tuple[str, ...]:
    return (*member_of(tenant), f"{S.QUOTAS_WRITE}!group={tenant}")


VIEWERS: dict[str, Caller] = {
    "tok-alice": _user("alice", {"team-a"}, *member_of("team-a")),
    "tok-bob": _user("bob", {"team-b"}, *member_of("team-b")),
    "tok-anna": _user("anna", {"team-a"}, *admin_of("team-a")),
    "tok-lead": _user("lead", set(), *READ_ALL),
    "tok-ops": _user("ops", set(), S.INVENTORY_READ),
    "tok-root": Caller("portal-admin", CallerKind.SERVICE, frozenset({S.ADMIN})),
}
"""Hub tokens of the seeded viewers: data scientists alice and bob, team-a's admin anna,
leadership (every tenant, read only), an operator, and an unfiltered portal admin."""


def _gpus(n: int, model: str = "H100-80GB") -> DeviceRequest:
    return DeviceRequest(FlavorKind.GPU, count=n, models=frozenset({model}))


def seed(alloc: Allocator) -> None:
    """Start ``alloc`` on the demo inventory with the tenants, quotas and workloads above."""
    alloc.start(load_demo())
    for t in ("team-a", "team-b"):
        alloc.set_tenant(t, cohort="research")
        alloc.set_quota(t, "H100-80GB", guaranteed=4, limit=8)
    alloc.set_quota("team-a", "T4/share", guaranteed=500, limit=1000)
    alloc.set_quota("team-b", "A100-80GB/1g.10gb", guaranteed=2, limit=4)
    share = DeviceRequest(FlavorKind.SHARE, milli=250, models=frozenset({"T4"}))
    mig_1g = DeviceRequest(FlavorKind.MIG, mig_profile="1g.10gb", models=frozenset({"A100-80GB"}))
    for tenant, owner, name, devices, kind in (
        ("team-a", "alice", "nb-alice", _gpus(1), WorkloadKind.NOTEBOOK),
        ("team-a", "alice", "train-a", _gpus(4), WorkloadKind.JOB),
        ("team-a", "alice", "infer-a", share, WorkloadKind.INFERENCE),
        ("team-b", "bob", "nb-bob", _gpus(2), WorkloadKind.NOTEBOOK),
        ("team-b", "bob", "mig-bob", mig_1g, WorkloadKind.NOTEBOOK),
        ("team-b", "bob", "train-b", _gpus(8), WorkloadKind.JOB),
    ):
        alloc.request(WorkloadRequest(tenant, owner, name, devices, kind=kind))
