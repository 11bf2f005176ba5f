"""Pre-started notebook environments under ``gpuportal serve`` (decision 0013).

``GPUPORTAL_PRESTART_BUDGET_GPUS`` above 0 turns it on (0, the default, is off: a placeholder
holds capacity for nobody, so a platform opts in with what it is willing to hold). Then:

- at start the platform's tenant (``GPUPORTAL_PRESTART_TENANT``) is created if missing and
  given a limit of the budget on every flavor it has no quota on, no guarantee: the allocator
  enforces the budget again, and a placeholder only ever uses capacity nobody is guaranteed
  (a quota already stored, an admin's edit, is kept across restarts);
- the ``prestart`` loop reconciles the pool every ``GPUPORTAL_PRESTART_INTERVAL_S`` seconds,
  and at once when the allocator commits a request that queues (``on_decision``, a store
  listener): a queued user is never left waiting for the next round behind a placeholder;
- the spawn options (the offers' catalogue of the inventory) and their rates
  (``portal.prestart.rates``) are refreshed every ``REFRESH_S``: a forecast fit costs tenths
  of a second of CPU, a reconcile round reads only memory;
- ``placeholder_for(option, devices)`` names the placeholder a spawn of that option adopts
  (``Allocator.request(adopt=...)``) and wakes the loop to start its replacement.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from policies.flavors import Flavor
from policies.prestart import PrestartTarget
from policies.quota import gpu_equivalent
from policies.requests import DeviceRequest
from portal.allocator import Allocator
from portal.allocator.offers import catalogue
from portal.api.metrics import Outcome
from portal.prestart.pool import PrestartPool, PrestartSpec
from portal.prestart.rates import option_rates, shape
from portal.service.loops import Loops
from portal.settings import Settings
from portal.store.records import EventRecord

log = logging.getLogger(__name__)

REFRESH_S = 300.0
"""Seconds between refreshes of the options and their forecast rates."""
WAKE_SLICE_S = 0.2
"""How often a waiting round checks whether the service is stopping."""
LOOP_GAP_S = 0.01
"""The loop's own interval: the work waits (for a wake-up or the interval) itself."""


@dataclass(frozen=True, slots=True)
class PrestartSettings:
    """The settings the pool runs with (``portal.settings`` validates them)."""

    budget_gpus: float
    horizon_s: float
    tenant: str
    interval_s: float

    @property
    def enabled(self) -> bool:
        return self.budget_gpus > 0


class PrestartService:
    """The pool, its options and rates, and the wake-up of its loop (module docstring)."""

    def __init__(
        self,
        alloc: Allocator,
        settings: PrestartSettings,
        *,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        refresh_s: float = REFRESH_S,
    ) -> None:
        self.settings = settings
        self._alloc = alloc
        self._clock = clock
        self._refresh_s = refresh_s
        self._refreshed = -math.inf
        self._wake = threading.Event()
        self.rates: dict[str, float] = {}
        self.plan: list[PrestartTarget] = []
        self.planned_at: datetime | None = None
        self.pool = PrestartPool(
            alloc,
            tenant=settings.tenant,
            options=[],
            rates=lambda: self.rates,
            budget=settings.budget_gpus,
            horizon_s=settings.horizon_s,
        )

    def setup(self) -> None:
        """The platform tenant and its limits: the budget on every flavor, no guarantee,
        for the flavors it has no quota on yet. A quota already stored is an admin's (or an
        earlier start's) and is kept: a restart never undoes an admin's edit. The budget
        still bounds the pool whatever the stored limit says (the smaller of the two wins)."""
        tenant = self.settings.tenant
        if tenant not in {t.name for t in self._alloc.tenants()}:
            self._alloc.set_tenant(tenant)
        stored = {q.flavor: q for q in self._alloc.quotas(tenant)}
        for flavor in sorted(self._alloc.capacity):
            unit = gpu_equivalent(Flavor.parse(flavor), 1)
            limit = math.floor(self.settings.budget_gpus / unit + 1e-9)
            kept = stored.get(flavor)
            if kept is None:
                self._alloc.set_quota(tenant, flavor, guaranteed=0, limit=limit)
            elif (kept.guaranteed, kept.limit) != (0, limit):
                log.info(
                    "pre-start tenant %s keeps its stored quota on %s (guaranteed %d, limit %d);"
                    " the budget alone would give limit %d",
                    tenant,
                    flavor,
                    kept.guaranteed,
                    kept.limit,
                    limit,
                )

    def refresh(self) -> None:
        """The options of the inventory now, and their forecast spawns per hour."""
        nodes = self._alloc.inspect(lambda c: [s.node for s in c])
        specs = [
            PrestartSpec(o.key, o.flavor, o.devices, o.devices.gpu_equivalent(o.model))
            for o in catalogue(nodes)
            if o.flavor is not None and o.model is not None
        ]
        self.pool.options = {s.key: s for s in specs}
        self.rates = option_rates(
            self._alloc.store, specs, self._clock(), exclude=self.settings.tenant
        )
        self._refreshed = time.monotonic()

    def round(self) -> None:
        """One reconcile, refreshing the options and rates first when they are due."""
        if time.monotonic() - self._refreshed >= self._refresh_s:
            self.refresh()
        self.plan = self.pool.reconcile()
        self.planned_at = self._clock()

    def wait_then_round(self, stopping: threading.Event) -> None:
        """The loop's work: wait for a wake-up or the interval (not before the first round),
        then one round."""
        deadline = time.monotonic() + self.settings.interval_s
        while self.planned_at is not None and not stopping.is_set():
            left = deadline - time.monotonic()
            if left <= 0 or self._wake.wait(min(WAKE_SLICE_S, left)):
                break
        if stopping.is_set():
            return
        self._wake.clear()
        self.round()

    def wake(self) -> None:
        self._wake.set()

    def on_decision(self, outcome: Outcome, event: EventRecord) -> None:
        """A store listener: a request that queued wakes the loop (which gives every
        placeholder back while anyone waits). Runs on the committing thread: only a flag."""
        if outcome is Outcome.QUEUED and event.tenant != self.settings.tenant:
            self._wake.set()

    def placeholder_for(self, option: str, devices: DeviceRequest) -> str | None:
        """The placeholder a spawn of ``option`` asking for ``devices`` adopts: None when
        none is held, or when the devices are not the option's (a caller naming an option
        it does not ask for adopts nothing)."""
        spec = self.pool.options.get(option)
        if spec is None or shape(spec.devices) != shape(devices):
            return None
        found = self.pool.placeholder(option)
        if found is not None:
            self.wake()  # a replacement, if the plan still wants one
        return found


def settings_of(settings: Settings) -> PrestartSettings:
    return PrestartSettings(
        budget_gpus=settings.prestart_budget_gpus,
        horizon_s=settings.prestart_horizon_s,
        tenant=settings.prestart_tenant,
        interval_s=settings.prestart_interval_s,
    )


def build_for_service(alloc: Allocator, settings: Settings) -> PrestartService | None:
    """The pre-start service of ``gpuportal serve``, its tenant and limits set up; None when
    off (a budget of 0)."""
    given = settings_of(settings)
    if not given.enabled:
        return None
    service = PrestartService(alloc, given)
    service.setup()
    log.info(
        "pre-starting notebook environments within %g GPU-equivalents (tenant %s)",
        given.budget_gpus,
        given.tenant,
        extra={"fields": {"budget_gpus": given.budget_gpus, "tenant": given.tenant}},
    )
    return service


def register(loops: Loops, service: PrestartService) -> None:
    """The ``prestart`` loop: its work waits for a wake-up or the interval itself, so the
    loop's own gap is short and a queued request is answered within a wait slice."""
    loops.add(
        "prestart", LOOP_GAP_S, lambda: service.wait_then_round(loops.stopping), first_after_s=0
    )
