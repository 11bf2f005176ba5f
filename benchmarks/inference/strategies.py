"""Scaling strategies compared by ``benchmarks.inference``, and where a fourth one plugs in.

A strategy gives a service its replica bounds at deploy time and may change them while the
trace plays (``step``, called every ``STEP_S`` with the arrivals seen so far, never the future
ones). The three built in are static: their ``step`` does nothing and the portal's own
autoscaler does the rest. A forecast-driven planner would be a class with the same two
methods that raises ``warm`` ahead of a predicted burst, added to ``STRATEGIES``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Protocol

STEP_S = 1.0
"""How often a strategy's ``step`` is called during the replay."""


@dataclass(frozen=True, slots=True)
class Bounds:
    """A service's ``replicas``: serving ``minimum``..``maximum``, ``warm`` beside them."""

    minimum: int
    maximum: int
    warm: int

    def spec(self) -> dict[str, int]:
        return {"min": self.minimum, "max": self.maximum, "warm": self.warm}

    @property
    def gpus(self) -> int:
        """The most devices the service can hold at once (one per replica)."""
        return self.maximum + self.warm


class Scaler(Protocol):
    """What a strategy may do to its service while the trace plays."""

    async def set_bounds(self, bounds: Bounds) -> None: ...


class Strategy(Protocol):
    @property
    def name(self) -> str:
        """Its name in the report and in its tenants' names (a DNS label)."""
        ...

    def bounds(self, max_replicas: int) -> Bounds:
        """The bounds to deploy with; their ``gpus`` sizes the tenant's quota (a planner that
        raises ``warm`` later answers the highest it will use, and lowers them in ``step``)."""
        ...

    async def step(self, scaler: Scaler, now_s: float, seen: tuple[float, ...]) -> None:
        """Called every ``STEP_S`` with the arrivals up to ``now_s`` (seconds into the trace)."""
        ...


@dataclass(frozen=True, slots=True)
class Static:
    """Fixed bounds; the portal's autoscaler moves the serving count within them."""

    name: str
    minimum: int
    warm: int

    def bounds(self, max_replicas: int) -> Bounds:
        return Bounds(self.minimum, max(self.minimum, max_replicas), self.warm)

    async def step(self, scaler: Scaler, now_s: float, seen: tuple[float, ...]) -> None:
        return None


STRATEGIES: Mapping[str, Strategy] = {
    "reactive": Static("reactive", minimum=0, warm=0),
    "warm-pool": Static("warm-pool", minimum=0, warm=1),
    "fixed-min": Static("fixed-min", minimum=1, warm=0),
}
