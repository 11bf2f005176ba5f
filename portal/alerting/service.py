"""The alert service: every ``interval_s`` it evaluates the rules over what was measured since
the last evaluation, joined with the live allocations, persists the alerts and runs actions.

One evaluation at ``now`` (the service registers ``evaluate`` as a loop):

1. read each device's samples since the previous evaluation (``[previous, now)``, at most two
   intervals back, else the last ``interval_s``): averages, peaks, last counters, throttle
   bits, and each workload's part of each device. ``interval_s`` must be at least the agents'
   sampling interval: a device without a sample in a window is not seen, and the conditions
   about it stop;
2. join them with the allocator's live allocations into the rules' ``DeviceSample``s: a whole
   GPU or MIG instance with its holder, a shared GPU as one sample per share holder (its own
   processes' part of the GPU) plus one unattributed sample of the GPU (errors, throttling);
   add tenant usage against quota, the queue, and budgets when a source is given;
3. step the pure engine (``policies.alerts.Engine``), save every transition (the alert's id
   is derived from its key and start, so saving twice changes nothing), then hand the
   transitions to each action.

The engine state survives a restart through the stored pending and firing alerts; rule memory
(noisy-neighbour baselines, previous counters) starts afresh.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Protocol

from policies.alerts import (
    AllocationContext,
    BudgetSample,
    DeviceSample,
    Engine,
    EngineState,
    QueueSample,
    ShareKind,
    Snapshot,
    TenantUsageSample,
    Transition,
    default_rules,
)
from policies.alerts.engine import Rule
from policies.alerts.throttle import THERMAL_OR_POWER
from portal.alerting.store import AlertStore
from portal.allocator import Allocator
from portal.telemetry.attribution import AllocationIndex
from portal.telemetry.reads import DeviceWindow, WorkloadWindow, device_windows, workload_windows

log = logging.getLogger(__name__)


class Action(Protocol):
    """Something done with the transitions of one evaluation. Must not raise for a failure of
    its own (log it): one broken action never stops the others or the evaluation."""

    def __call__(self, transitions: Sequence[Transition], now: float) -> None: ...


BudgetSource = Callable[[float], Iterable[BudgetSample]]


@dataclass(frozen=True, slots=True)
class Measured:
    devices: list[DeviceWindow]
    workloads: list[WorkloadWindow]


def share_device(gpu_uuid: str, workload_id: str) -> str:
    """The rules' device name of one workload's share of a GPU."""
    return f"{gpu_uuid}/share/{workload_id}"


def _sample(
    dw: DeviceWindow,
    device: str,
    ctx: AllocationContext | None,
    *,
    utilization: float | None = None,
    memory_used_mib: float | None = None,
    parent: str = "",
    counters: bool = True,
    label: str = "",
) -> DeviceSample:
    """A rules' sample from a device window; a share overrides utilization and memory with its
    own part (and carries no counters: they are the GPU's)."""
    util = dw.utilization_avg if utilization is None else utilization
    activity = dw.activity_avg if dw.activity_avg is not None and utilization is None else util
    return DeviceSample(
        device=device,
        at=dw.last_at,
        utilization_pct=util,
        memory_used_mib=dw.memory_used_max if memory_used_mib is None else memory_used_mib,
        memory_total_mib=dw.memory_total_mib,
        activity_pct=activity,
        power_w=dw.power_max or 0.0,
        temperature_c=dw.temperature_max or 0.0,
        throttle_reasons=dw.throttle_reasons if counters else 0,
        xid_count=dw.xid_count if counters else 0,
        ecc_uncorrectable=dw.ecc_uncorrectable if counters else 0,
        allocation=ctx,
        parent=parent,
        label=label,
        last_xid=dw.last_xid if counters else None,
    )


def device_samples(measured: Measured, index: AllocationIndex) -> list[DeviceSample]:
    """The rules' samples: measured windows joined with who holds each device.

    A device without SM activity measured is judged on its utilization; one with neither (a
    MIG instance on a GPU without GPU Performance Monitoring) keeps ``None`` for both, so the
    rules judge its memory, errors and throttling but never call it idle.
    """
    by_device: dict[str, list[WorkloadWindow]] = {}
    for w in measured.workloads:
        by_device.setdefault(w.device, []).append(w)
    out: list[DeviceSample] = []
    for dw in measured.devices:
        holders = index.holders.get(dw.gpu_uuid, ())
        attributed = {w.workload_id: w for w in by_device.get(dw.device, [])}
        info = index.gpus.get(dw.gpu_uuid)
        label = info.label() if info is not None else ""
        if dw.device != dw.gpu_uuid:  # a MIG instance: its holder is who ingest attributed
            holder = next(
                (h for h in holders if h.share is ShareKind.MIG and h.workload_id in attributed),
                None,
            )
            ctx = None if holder is None else holder.context()
            mig = f" / MIG {holder.mig_profile}" if holder and holder.mig_profile else " / MIG"
            out.append(_sample(dw, dw.device, ctx, parent=dw.gpu_uuid, label=label and label + mig))
            continue
        whole = [h for h in holders if h.share is ShareKind.WHOLE]
        if whole:
            out.append(_sample(dw, dw.device, whole[0].context(), label=label))
            continue
        out.append(_sample(dw, dw.device, None, label=label))  # the GPU: errors, throttling
        for h in holders:
            ww = attributed.get(h.workload_id)
            if h.share is not ShareKind.MILLI or ww is None or ww.utilization_avg is None:
                continue  # no per-process measure: the share cannot be judged
            out.append(
                _sample(
                    dw,
                    share_device(dw.gpu_uuid, h.workload_id),
                    h.context(),
                    utilization=ww.utilization_avg,
                    memory_used_mib=ww.memory_used_max,
                    parent=dw.gpu_uuid,
                    counters=False,
                    label=label,
                )
            )
    return out


class AlertService:
    """Evaluates the alert rules over stored telemetry and the live allocator.

    Args:
        alloc: the started allocator (allocations, usage, queue; its database holds the
            samples and the alerts).
        rules: the rules and their settings; default ``policies.alerts.default_rules()``.
        interval_s: time between evaluations, and the window each one reads.
        actions: called with each evaluation's transitions (webhook, culler, ...).
        budgets: a source of ``BudgetSample`` at a time (cost accounting); none by default.
        clock: epoch seconds.
    """

    def __init__(
        self,
        alloc: Allocator,
        *,
        rules: Sequence[Rule] | None = None,
        interval_s: float = 60.0,
        actions: Sequence[Action] = (),
        budgets: BudgetSource | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.alloc = alloc
        self.engine = Engine(tuple(rules) if rules is not None else default_rules())
        self.interval_s = interval_s
        self.actions = list(actions)
        self.budgets = budgets
        self.clock = clock
        self.store = AlertStore(alloc.store.engine)
        self._lock = threading.Lock()
        active = {a.key: a for a in self.store.active()}
        self.state = EngineState(alerts=MappingProxyType(active))
        self._throttle_mask = THERMAL_OR_POWER

    def evaluate(self, now: float | None = None) -> tuple[Transition, ...]:
        """One evaluation at ``now`` (default: the clock); returns its transitions."""
        with self._lock:
            now = self.clock() if now is None else now
            if self.state.now is not None and now == self.state.now:
                return ()  # evaluated at this time already: nothing new to read
            snapshot = self.snapshot(now)
            self.state, transitions = self.engine.step(self.state, snapshot, now)
            for skipped in self.state.skipped:
                log.info("alert sample skipped: %s (%s)", skipped.sample.device, skipped.reason)
            self.store.save(t.alert for t in transitions)
        for action in self.actions:
            try:
                action(transitions, now)
            except Exception:  # an action's own failure must not stop the others
                log.exception("alert action %r failed", action)
        return transitions

    def snapshot(self, now: float) -> Snapshot:
        engine = self.alloc.store.engine
        # Read from the previous evaluation on, so a late round neither skips nor re-reads
        # samples; after a long pause (or at first) only the last interval.
        last = self.state.now
        start = (
            last
            if last is not None and 0 < now - last <= 2 * self.interval_s
            else now - self.interval_s
        )
        measured = Measured(
            device_windows(engine, start, now, self._throttle_mask),
            workload_windows(engine, start, now),
        )
        workloads = self.alloc.workloads()
        nodes = self.alloc.inspect(lambda c: [ns.node for ns in c])
        index = AllocationIndex.build(nodes, workloads)
        tenants = []
        for t in self.alloc.tenants():
            for u in self.alloc.usage(t.name):
                if u.limit > 0:
                    tenants.append(TenantUsageSample(t.name, u.flavor, now, u.used, u.limit))
        queue = [
            QueueSample(
                q.workload_id, q.tenant, q.owner, q.enqueued_at.timestamp(), now, name=q.name
            )
            for q in self.alloc.queue()
        ]
        budgets = tuple(self.budgets(now)) if self.budgets is not None else ()
        return Snapshot(
            devices=tuple(device_samples(measured, index)),
            tenants=tuple(tenants),
            queue=tuple(queue),
            budgets=budgets,
        )
