"""The pool of pre-started notebook environments: placeholders that hold devices for the
spawn options most likely to be picked next (decision 0013; the sizing is
``policies.prestart.plan_prestart``).

A placeholder is an allocator workload of kind ``notebook`` of the platform's own tenant (its
cost and usage are the platform's, never a tenant's; that tenant's quota limit bounds the pool
again), requested on free capacity only (``free_only``: placed at once or not at all, never
queued, never reclaiming) at the lowest priority, with an idempotency key
``prestart/<option>/<uuid>`` that finds it again after a restart.

- ``reconcile()`` decides on one reading of the allocator (held placeholders, free capacity,
  queued flavors), then acts: it releases what the plan no longer wants (every placeholder of
  a flavor someone queues for first), then requests what is missing.
- ``placeholder(option)`` names the oldest placeholder of an option: a spawn of it passes
  that id to ``Allocator.request(adopt=...)``, which releases it and places the spawn in one
  decision; the next ``reconcile`` starts a replacement if still wanted. ``adopt(option)``
  only gives one back (for a caller that requests separately).

The loop, the rates and the settings are ``portal.prestart.service``.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime

from policies.errors import Forbidden
from policies.prestart import DEFAULT_HORIZON_S, PrestartOption, PrestartTarget, plan_prestart
from policies.requests import MAX_PRIORITY, DeviceRequest, WorkloadKind, WorkloadRequest
from portal.allocator import Allocator
from portal.allocator.intake import NoFreeRoom
from portal.allocator.state import State
from portal.store.records import WorkloadState

KEY_PREFIX = "prestart/"
OWNER = "gpuportal-prestart"


@dataclass(frozen=True, slots=True)
class PrestartSpec:
    """An option the pool may keep: its offer key, flavor, devices and GPU-equivalents."""

    key: str
    flavor: str
    devices: DeviceRequest
    cost: float


class PrestartPool:
    """Placeholders of ``tenant`` (the platform's) for ``options``, sized from ``rates``
    (forecast spawns per hour per option key) within ``budget`` GPU-equivalents."""

    def __init__(
        self,
        alloc: Allocator,
        *,
        tenant: str,
        options: Sequence[PrestartSpec],
        rates: Callable[[], Mapping[str, float]],
        budget: float,
        horizon_s: float = DEFAULT_HORIZON_S,
    ) -> None:
        self._alloc = alloc
        self.tenant = tenant
        self.options = {o.key: o for o in options}
        self._rates = rates
        self.budget = budget
        self.horizon_s = horizon_s

    def held(self) -> dict[str, list[str]]:
        """Running placeholders per option key, oldest first."""

        def found(st: State) -> list[tuple[datetime, str, str]]:
            return sorted(
                (lv.rec.created_at, wid, key)
                for wid, lv in st.live.items()
                if (key := lv.rec.idempotency_key or "").startswith(KEY_PREFIX)
                and lv.rec.state is WorkloadState.RUNNING
            )

        out: dict[str, list[str]] = defaultdict(list)
        for _at, wid, key in self._alloc.read(found):
            out[key[len(KEY_PREFIX) :].rsplit("/", 1)[0]].append(wid)
        return dict(out)

    def plan(self, held: Mapping[str, list[str]]) -> list[PrestartTarget]:
        """The plan on the allocator's current state: free capacity counts the placeholders
        held as free (they are the pool's to move). While anyone waits in the queue no
        option gets one: a queued request may accept several flavors, and this errs on the
        side of the waiting user."""
        waiting = any(self._alloc.queue_counts().values())
        queued = {o.flavor for o in self.options.values()} if waiting else set()
        used: dict[str, float] = defaultdict(float)
        for tenant in self._alloc.tenants():
            for u in self._alloc.usage(tenant.name):
                used[u.flavor] += u.used
        ours: dict[str, float] = defaultdict(float)
        for key, ids in held.items():
            if key in self.options:
                ours[self.options[key].flavor] += self.options[key].cost * len(ids)
        free = {f: cap - used[f] + ours[f] for f, cap in self._alloc.capacity.items()}
        rates = self._rates()
        options = [
            PrestartOption(o.key, o.flavor, o.cost, rates.get(o.key, 0.0))
            for o in self.options.values()
        ]
        return plan_prestart(
            options, budget=self.budget, free=free, queued=queued, horizon_s=self.horizon_s
        )

    def reconcile(self) -> list[PrestartTarget]:
        """Release what the plan no longer wants, then request what it misses."""
        held = self.held()
        plan = self.plan(held)
        wanted = {t.key: t.count for t in plan}
        for key, ids in held.items():
            for wid in ids[wanted.get(key, 0) :]:
                self._alloc.release(wid, reason="pre-started environment not needed")
        for t in plan:
            for _ in range(t.count - len(held.get(t.key, []))):
                if not self._request(self.options[t.key]):
                    break
        return plan

    def placeholder(self, option: str) -> str | None:
        """The oldest placeholder held for ``option``, or None."""
        ids = self.held().get(option, [])
        return ids[0] if ids else None

    def adopt(self, option: str) -> bool:
        """Give back one placeholder of ``option`` for a spawn of it; False when none held."""
        ids = self.held().get(option, [])
        if not ids:
            return False
        self._alloc.release(ids[0], reason="pre-started environment adopted by a spawn")
        return True

    def _request(self, o: PrestartSpec) -> bool:
        try:
            self._alloc.request(
                WorkloadRequest(
                    tenant=self.tenant,
                    owner=OWNER,
                    name=f"pre-started {o.key}",
                    devices=o.devices,
                    kind=WorkloadKind.NOTEBOOK,
                    priority=-MAX_PRIORITY,
                ),
                idempotency_key=f"{KEY_PREFIX}{o.key}/{uuid.uuid4().hex}",
                estimate=False,
                free_only=True,
            )
        except (NoFreeRoom, Forbidden):
            # Forbidden: the platform tenant's stored limit (an admin may set it below the
            # budget) can never hold this option; the pool holds what the limit allows.
            return False
        return True
