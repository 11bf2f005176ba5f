"""Preemption: choose victims on a snapshot; acting on them (warning, signal, stop) is the
engine's business.

``select_victims`` turns a reclaim plan (``policies.quota.reclaim_plan``: tenant -> amount) into
workloads. For each tenant it walks that tenant's workloads of the flavor from the cheapest to
stop to the dearest — lowest priority first, then the youngest (latest started), then the
workload id — until their amounts cover the need, then drops every victim that turned out
unnecessary, trying the dearest first. The result is minimal: removing any one victim leaves
the tenant's need uncovered (so, amounts being positive, no proper subset covers it).

A tenant named in the plan is above its guaranteed, so any of its workloads of that flavor
runs on borrowed quota and may be chosen (``RunningItem.borrowed`` is informational). So an
inference service's borrowed replicas go warm ones first (their priority is the lowest), then
the newest serving one first.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

from policies.errors import InvalidRequest
from policies.requests import WorkloadKind

DEFAULT_NOTEBOOK_GRACE_S = 300.0
DEFAULT_JOB_GRACE_S = 120.0
DEFAULT_INFERENCE_GRACE_S = 30.0
MAX_GRACE_S = 86_400.0


@dataclass(frozen=True, slots=True)
class RunningItem:
    """A running workload as preemption sees it (amount in the flavor's unit)."""

    workload_id: str
    tenant: str
    flavor: str
    amount: int
    priority: int
    started_at: float
    borrowed: int = 0
    seq: int = 0
    """The order of the request among the allocator's workloads (higher: requested later)."""


def select_victims(
    candidates: Sequence[RunningItem], need: Mapping[str, int], flavor: str
) -> list[str] | None:
    """Workload ids to preempt so each tenant in ``need`` frees at least its amount of
    ``flavor``; ``None`` when some tenant's workloads cannot cover its need.

    Victims are listed tenant by tenant (sorted by name), each tenant's in the order chosen.
    """
    by_tenant: dict[str, list[RunningItem]] = {}
    for item in candidates:
        if item.flavor == flavor and item.amount > 0 and need.get(item.tenant, 0) > 0:
            by_tenant.setdefault(item.tenant, []).append(item)
    victims: list[str] = []
    for tenant in sorted(need):
        amount = need[tenant]
        if amount <= 0:
            continue
        chosen = _cover(by_tenant.get(tenant, []), amount)
        if chosen is None:
            return None
        victims.extend(item.workload_id for item in chosen)
    return victims


def _cover(items: list[RunningItem], amount: int) -> list[RunningItem] | None:
    order = sorted(items, key=lambda i: (i.priority, -i.started_at, -i.seq, i.workload_id))
    chosen: list[RunningItem] = []
    total = 0
    for item in order:
        if total >= amount:
            break
        chosen.append(item)
        total += item.amount
    if total < amount:
        return None
    # The last one chosen is needed (the others summed to less); try sparing the rest,
    # dearest first. A victim kept here stays needed as later ones are spared.
    for i in range(len(chosen) - 2, -1, -1):
        if total - chosen[i].amount >= amount:
            total -= chosen[i].amount
            del chosen[i]
    return chosen


class PreemptionAction(StrEnum):
    """How a victim is told: notebooks get a warning then a stop after the grace; jobs get a
    termination signal and the grace to checkpoint; inference replicas get a drain."""

    WARN = "warn"
    SIGNAL = "signal"
    DRAIN = "drain"


@dataclass(frozen=True, slots=True)
class PreemptionPolicy:
    """Grace periods by workload kind, in seconds (0 to one day)."""

    notebook_grace_s: float = DEFAULT_NOTEBOOK_GRACE_S
    job_grace_s: float = DEFAULT_JOB_GRACE_S
    inference_grace_s: float = DEFAULT_INFERENCE_GRACE_S

    def __post_init__(self) -> None:
        for name in ("notebook_grace_s", "job_grace_s", "inference_grace_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidRequest(name, repr(value), f"seconds from 0 to {MAX_GRACE_S:g}")
            if not 0 <= value <= MAX_GRACE_S:
                raise InvalidRequest(name, value, f"seconds from 0 to {MAX_GRACE_S:g}")

    def notice(
        self, workload_id: str, kind: WorkloadKind, now: float, reason: str = ""
    ) -> PreemptionNotice:
        """The notice for one victim, chosen at ``now``."""
        if kind is WorkloadKind.NOTEBOOK:
            action, grace = PreemptionAction.WARN, self.notebook_grace_s
        elif kind in (WorkloadKind.JOB, WorkloadKind.RAY):
            # A Ray worker is stopped like a job member: SIGTERM, then the job grace.
            action, grace = PreemptionAction.SIGNAL, self.job_grace_s
        else:
            action, grace = PreemptionAction.DRAIN, self.inference_grace_s
        return PreemptionNotice(workload_id, kind, action, grace, now + grace, reason)


@dataclass(frozen=True, slots=True)
class PreemptionNotice:
    """What the engine tells a victim, and when it stops it (``deadline_at``)."""

    workload_id: str
    kind: WorkloadKind
    action: PreemptionAction
    grace_s: float
    deadline_at: float
    reason: str = ""
