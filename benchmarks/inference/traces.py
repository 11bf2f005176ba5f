"""Seeded request traces: arrival times, in seconds from the start of the replay.

Both are inhomogeneous Poisson processes drawn by thinning, so one seed gives the same trace
on every machine and every strategy of a run sees the very same arrivals.

- **bursty**: on/off bursts; during a burst requests come at ``rate`` per second, between
  bursts none. The silent gaps are longer than the scale-to-zero idle time, so a reactive
  service goes back to zero between bursts and the next burst meets a cold start.
- **diurnal**: a compressed day (``day_s`` seconds of wall time for 24 h), a sinusoid with
  multiplicative noise per second; it starts at midnight, the night a quiet half day long
  (no requests), so a reactive service scales to zero overnight.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum


class TraceKind(StrEnum):
    BURSTY = "bursty"
    DIURNAL = "diurnal"


@dataclass(frozen=True, slots=True)
class Trace:
    """One trace: its kind, how long it lasts and its arrivals (sorted, within the length)."""

    kind: TraceKind
    duration_s: float
    arrivals: tuple[float, ...]

    def seen_by(self, t: float) -> tuple[float, ...]:
        """The arrivals up to ``t``: what a planner may know at that time (never the future)."""
        return tuple(a for a in self.arrivals if a <= t)


def _thinned(
    rng: random.Random, duration_s: float, rate_max: float, rate: Callable[[float], float]
) -> tuple[float, ...]:
    out: list[float] = []
    t = 0.0
    while rate_max > 0:
        t += rng.expovariate(rate_max)
        if t >= duration_s:
            break
        if rng.random() * rate_max < rate(t):
            out.append(round(t, 4))
    return tuple(out)


def bursty(seed: int, duration_s: float, rate: float, on_s: float, off_s: float) -> Trace:
    """Bursts of about ``on_s`` seconds at ``rate`` requests/s, gaps of about ``off_s``
    (each 0.5 to 1.5 times the mean, drawn); it starts with a gap."""
    rng = random.Random(f"bursty-{seed}")
    spans: list[tuple[float, float]] = []
    t = off_s * rng.uniform(0.5, 1.0)
    while t < duration_s:
        length = on_s * rng.uniform(0.5, 1.5)
        spans.append((t, min(duration_s, t + length)))
        t += length + off_s * rng.uniform(0.5, 1.5)

    def on(x: float) -> float:
        return rate if any(a <= x < b for a, b in spans) else 0.0

    return Trace(TraceKind.BURSTY, duration_s, _thinned(rng, duration_s, rate, on))


def diurnal(seed: int, duration_s: float, day_s: float, peak_rate: float) -> Trace:
    """``duration_s`` of days compressed to ``day_s`` seconds each: the rate follows
    ``peak_rate × max(0, -cos(2πt / day_s))`` (zero from 18:00 to 06:00, the peak at noon),
    times a lognormal noise drawn per second (σ 0.3, mean 1)."""
    rng = random.Random(f"diurnal-{seed}")
    sigma = 0.3
    noise = [math.exp(rng.gauss(-sigma * sigma / 2, sigma)) for _ in range(int(duration_s) + 1)]

    def rate(x: float) -> float:
        return peak_rate * max(0.0, -math.cos(2 * math.pi * x / day_s)) * noise[int(x)]

    top = peak_rate * max(noise)
    return Trace(TraceKind.DIURNAL, duration_s, _thinned(rng, duration_s, top, rate))
