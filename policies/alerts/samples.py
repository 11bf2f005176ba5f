"""Typed samples the alert rules read: devices, tenant usage, the queue and budgets.

A device sample names one GPU, MIG instance or share at one time ``at`` (epoch s). Percentages
(``utilization_pct``, ``activity_pct``) are of the device the sample names: of the MIG instance
for a MIG sample (as DCGM reports per instance), of the parent GPU for a share sample (a
workload's part of a GPU it shares with others, from per-process accounting) and of the GPU for
a whole GPU. Counters (``xid_count``, ``ecc_uncorrectable``) are cumulative. A percentage of
``None`` was not measured (a MIG instance on a GPU without GPU Performance Monitoring, A100 and
A30): the rules that judge use (idle, noisy neighbour) leave such a sample out, and the health
rules (XID, ECC, throttling) and memory rules judge it as any other.

Malformed values (NaN, negative, a percentage above 100, a counter below 0) raise
``InvalidRequest`` when a sample is built, so they never reach the engine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from decimal import Decimal
from enum import StrEnum, auto

from policies.errors import InvalidRequest
from policies.flavors import MILLI_PER_GPU


class ShareKind(StrEnum):
    """How the sampled device is allocated."""

    WHOLE = auto()
    MIG = auto()
    MILLI = auto()


def _finite(field: str, value: float, lo: float = 0.0, hi: float = math.inf) -> None:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not lo <= value <= hi
    ):
        bound = f"<= {hi}" if hi != math.inf else "finite"
        raise InvalidRequest(field, value, f"a number >= {lo} and {bound}")


def _count(field: str, value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequest(field, value, "an integer >= 0")


def _name(field: str, value: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidRequest(field, repr(value), "a non-empty string")


@dataclass(frozen=True, slots=True)
class AllocationContext:
    """Who holds the sampled device and how much of it.

    Attributes:
        share: whole GPU, MIG instance, or milli share of a GPU.
        milli: the share in milli-GPU (MILLI only).
        mig_slices / mig_total_slices: the instance's compute slices and its GPU's (MIG only).
        memory_mib: the GPU memory the share may use; 0 means milli / 1000 of the GPU's memory.
        node / domain: the node and its NVLink or PCIe domain.
        name: the workload's name as its owner knows it (the spawn page's and My work's);
            summaries use it, and the id only when it is empty.
    """

    workload_id: str
    tenant: str
    owner: str
    share: ShareKind = ShareKind.WHOLE
    milli: int = MILLI_PER_GPU
    mig_slices: int = 0
    mig_total_slices: int = 0
    memory_mib: int = 0
    node: str = ""
    domain: str = ""
    name: str = ""

    def __post_init__(self) -> None:
        _name("workload id", self.workload_id)
        _name("tenant", self.tenant)
        _name("owner", self.owner)
        if self.share is ShareKind.MILLI and not 0 < self.milli <= MILLI_PER_GPU:
            raise InvalidRequest("milli", self.milli, f"1..{MILLI_PER_GPU} for a share")
        if self.share is ShareKind.MIG and not 0 < self.mig_slices <= self.mig_total_slices:
            raise InvalidRequest(
                "MIG slices",
                f"{self.mig_slices}/{self.mig_total_slices}",
                "0 < slices <= total slices for a MIG instance",
            )
        _count("memory_mib", self.memory_mib)

    @property
    def parent_fraction(self) -> float:
        """The part of the parent GPU allocated: 1, slices / total, or milli / 1000."""
        if self.share is ShareKind.MIG:
            return self.mig_slices / self.mig_total_slices
        if self.share is ShareKind.MILLI:
            return self.milli / MILLI_PER_GPU
        return 1.0

    @property
    def display(self) -> str:
        """How summaries name the workload: its name, else its id."""
        return self.name or self.workload_id


@dataclass(frozen=True, slots=True)
class DeviceSample:
    """One GPU, MIG instance or share at ``at``; ``parent`` is the physical GPU ("" = itself).

    ``label`` names the device for people (``node: GPU index``, as the spawn page and My work
    do); ``last_xid`` is the code of the latest XID error reported (``None``: none or unknown).
    """

    device: str
    at: float
    utilization_pct: float | None
    memory_used_mib: float = 0.0
    memory_total_mib: float = 0.0
    activity_pct: float | None = 0.0
    power_w: float = 0.0
    temperature_c: float = 0.0
    throttle_reasons: int = 0
    xid_count: int = 0
    ecc_uncorrectable: int = 0
    allocation: AllocationContext | None = None
    parent: str = ""
    label: str = ""
    last_xid: int | None = None

    def __post_init__(self) -> None:
        _name("device", self.device)
        _finite("sample time", self.at)
        if self.utilization_pct is not None:
            _finite("utilization", self.utilization_pct, 0, 100)
        if self.activity_pct is not None:
            _finite("activity", self.activity_pct, 0, 100)
        _finite("memory used", self.memory_used_mib)
        _finite("memory total", self.memory_total_mib)
        _finite("power", self.power_w)
        _finite("temperature", self.temperature_c, -273.15)
        _count("throttle reasons", self.throttle_reasons)
        _count("XID count", self.xid_count)
        _count("uncorrectable ECC count", self.ecc_uncorrectable)
        if self.last_xid is not None:
            _count("last XID", self.last_xid)

    @property
    def where(self) -> str:
        """How summaries name the device: its label, else its id."""
        return self.label or self.device

    @property
    def gpu(self) -> str:
        """The physical GPU this sample is on."""
        return self.parent or self.device


@dataclass(frozen=True, slots=True)
class TenantUsageSample:
    """A tenant's usage of one flavor against its quota limit (in the flavor's unit)."""

    tenant: str
    flavor: str
    at: float
    used: float
    limit: float

    def __post_init__(self) -> None:
        _name("tenant", self.tenant)
        _name("flavor", self.flavor)
        _finite("sample time", self.at)
        _finite("usage", self.used)
        _finite("limit", self.limit)


@dataclass(frozen=True, slots=True)
class QueueSample:
    """A queued workload and since when it waits."""

    workload_id: str
    tenant: str
    owner: str
    queued_since: float
    at: float
    name: str = ""

    def __post_init__(self) -> None:
        _name("workload id", self.workload_id)
        _finite("queued since", self.queued_since)
        _finite("sample time", self.at)


@dataclass(frozen=True, slots=True)
class BudgetSample:
    """A tenant's spend so far in the budget period ``[period_start, period_end)``."""

    tenant: str
    at: float
    spent: Decimal
    budget: Decimal
    period_start: int
    period_end: int

    def __post_init__(self) -> None:
        _name("tenant", self.tenant)
        _finite("sample time", self.at)
        for field, value in (("spent", self.spent), ("budget", self.budget)):
            if not isinstance(value, Decimal) or not value.is_finite() or value < 0:
                raise InvalidRequest(field, value, "a finite Decimal >= 0")
        for field, t in (("period start", self.period_start), ("period end", self.period_end)):
            if isinstance(t, bool) or not isinstance(t, int):
                raise InvalidRequest(field, repr(t), "whole epoch seconds (int)")
        if self.period_end <= self.period_start:
            raise InvalidRequest(
                "budget period", f"[{self.period_start}, {self.period_end})", "end > start"
            )


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Everything sampled at one evaluation time."""

    devices: tuple[DeviceSample, ...] = ()
    tenants: tuple[TenantUsageSample, ...] = ()
    queue: tuple[QueueSample, ...] = ()
    budgets: tuple[BudgetSample, ...] = ()
