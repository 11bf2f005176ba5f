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

All start at ``START`` (2026-11-02 09:00 UTC); the clock then stands at ``NOW``, 24 hours later.
Prices per GPU-hour: H100-80GB 4.00, A100-80GB 2.00, T4 0.40 USD; money budgets team-a 500,
team-b 300. Cost from Nov 1 to ``NOW``:

- team-a: nb-alice 1 × 24 h × 4.00 = 96.00; train-a 4 × 24 × 4.00 = 384.00; infer-a
  0.25 × 24 × 0.40 = 2.40: **482.40** (15 h on Nov 2: 301.50, 9 h on Nov 3: 180.90)
- team-b: nb-bob 2 × 24 × 4.00 = 192.00; mig-bob 1/7 × 24 × 2.00 = 6.857…: **198.86**
  (Nov 2: 120 + 30/7 = 124.29; Nov 3: 72 + 18/7 = 74.57)
- per flavor: H100-80GB 672.00, A100-80GB/1g.10gb 6.86, T4/share 2.40; total 681.26
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from policies.flavors import FlavorKind
from policies.requests import DeviceRequest, WorkloadKind, WorkloadRequest
from portal.accounting.prices import PriceConfig, price_config
from portal.allocator import Allocator
from portal.api.auth import Caller, CallerKind, Scope
from portal.inventory.simulated import load_demo

S = Scope
START = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)
NOW = START + timedelta(hours=24)
PRICES: PriceConfig = price_config(
    {
        "currency": "USD",
        "prices": {"H100-80GB": "4.00", "A100-80GB": "2.00", "T4": "0.40"},
        "budgets": {"team-a": "500", "team-b": "300"},
    }
)


@dataclass
class SeedClock:
    """The allocator's and accounting's clock: ``START`` while seeding, then ``NOW``."""

    now: datetime = field(default=START)

    def __call__(self) -> datetime:
        return self.now


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
    return (*member_of(tenant), f"{S.QUOTAS_WRITE}!group={tenant}", f"{S.COST_READ}!group={tenant}")


VIEWERS: dict[str, Caller] = {
    "tok-alice": _user("alice", {"team-a"}, *member_of("team-a")),
    "tok-bob": _user("bob", {"team-b"}, *member_of("team-b")),
    "tok-anna": _user("anna", {"team-a"}, *admin_of("team-a")),
    "tok-lead": _user("lead", set(), *READ_ALL),
    "tok-ops": _user("ops", set(), S.INVENTORY_READ),
    "tok-mia": _user("mia", {"team-a"}, *member_of("team-a"), f"{S.INVENTORY_READ}!group=team-a"),
    "tok-root": Caller("portal-admin", CallerKind.SERVICE, frozenset({S.ADMIN})),
}
"""Hub tokens of the seeded viewers: data scientists alice and bob, team-a's admin anna,
leadership (every tenant, read only), an operator, mia (a member of team-a with the inventory
read the hub's member role grants) and an unfiltered portal admin."""


def _gpus(n: int, model: str = "H100-80GB") -> DeviceRequest:
    return DeviceRequest(FlavorKind.GPU, count=n, models=frozenset({model}))


def seed(alloc: Allocator, clock: SeedClock) -> None:
    """Start ``alloc`` (running on ``clock``) on the demo inventory with the tenants, quotas
    and workloads above; leaves the clock at ``NOW``."""
    clock.now = START
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
    clock.now = NOW
