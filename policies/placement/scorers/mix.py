"""The request mix gpuportal learns from the allocator's history (``observe``).

Every request seen — placed or not, since a request that failed is demand too — is counted in
a histogram of request shapes (``fragmentation.Shape``) and, for MIG, of (model, profile),
each weight decayed with a half-life of ``half_life`` requests. The histogram is turned into
the *distribution* the terms score against:

- the most frequent shapes covering ``coverage`` of the decayed mass, renormalised to sum 1;
- re-derived after the 1st, 2nd, 4th, … request while fewer than ``refresh_every`` have been
  seen, then after every ``refresh_every`` requests;
- adopted only when it moved by more than ``drift`` in total variation (half the sum of the
  absolute differences), since every adoption invalidates the pipeline's cached scores.

The CPU and memory per GPU milli of the GPU-using requests (``host.HostDemand``, decayed alike)
are re-read when a distribution is adopted and, until they are known, after every request — so
they too change only when cached scores are invalidated anyway.

Example: ``half_life`` 2 weighs each request √2 times the one before it. After the shares
500, 500, 300, 300 (a refresh is due at the 4th) the histogram holds 1 + 1.41 = 2.41 for the
500 and 2 + 2.83 = 4.83 for the 300; with ``coverage`` 0.95 both shapes are kept (the 300
alone covers 0.67 of the mass): p = {300: 0.67, 500: 0.33}. It moved by 0.67 from the
{500: 1} adopted after the 1st request (which replaced ``PRIOR``, the distribution before
anything was observed), far more than ``drift``, and is adopted.
"""

from __future__ import annotations

import enum
from collections.abc import Hashable, Mapping
from typing import TypeVar

from policies.flavors import MILLI_PER_GPU
from policies.placement.scorers.fragmentation import Shape
from policies.placement.scorers.host import HostDemand
from policies.requests import DeviceRequest

# Shapes assumed before anything was observed: whole GPUs of every usual count and a share.
PRIOR: tuple[tuple[Shape, float], ...] = (
    (Shape(0, MILLI_PER_GPU, 1), 0.4),
    (Shape(0, 500, 1), 0.3),
    (Shape(0, MILLI_PER_GPU, 2), 0.1),
    (Shape(0, MILLI_PER_GPU, 4), 0.1),
    (Shape(0, MILLI_PER_GPU, 8), 0.1),
)

K = TypeVar("K", bound=Hashable)

# Increments grow instead of every weight shrinking; past this they are rescaled to 1.
_RESCALE_AT = 1e100


class Learned(enum.Flag):
    """What one ``RequestMix.observe`` changed (the parts built from it must be rebuilt)."""

    NOTHING = 0
    SHAPES = enum.auto()  # a new shape distribution was adopted
    MIG = enum.auto()  # a new MIG profile distribution was adopted
    HOST = enum.auto()  # the CPU / memory per GPU milli changed


class RequestMix:
    """Decayed histograms of the requests seen and the distributions adopted from them.

    ``generation`` counts the changes that alter scores (a new distribution, new host
    ratios): it is gpuportal's cache token.
    """

    def __init__(self, half_life: float, coverage: float, refresh_every: int, drift: float) -> None:
        self.decay = 0.5 ** (1.0 / half_life)
        self.coverage = coverage
        self.refresh_every = refresh_every
        self.drift = drift
        self.generation = 0
        self.distribution: dict[Shape, float] = dict(PRIOR)
        self.mig_distribution: dict[tuple[str, str], float] = {}
        # CPU milli and memory MiB per GPU milli of the GPU-using requests seen (0: none yet).
        self.cpu_ratio = 0.0
        self.memory_ratio = 0.0
        self._hist: dict[Shape, float] = {}
        self._mig_hist: dict[tuple[str, str], float] = {}
        self._host = HostDemand()
        self._inc = 1.0
        self._seen = 0

    def observe(self, req: DeviceRequest) -> Learned:
        """Count ``req``; refresh the distributions when due. Returns what changed."""
        self._host.add(req, self._inc)
        shape = Shape.of(req)
        if shape is not None:
            self._hist[shape] = self._hist.get(shape, 0.0) + self._inc
        elif req.mig_profile is not None:
            for model in req.models:
                key = (model, req.mig_profile)
                self._mig_hist[key] = self._mig_hist.get(key, 0.0) + self._inc
        # Growing increments instead of shrinking every weight: same ratios, O(1) per request.
        self._inc /= self.decay
        if self._inc > _RESCALE_AT:
            self._rescale()
        self._seen += 1
        n = self._seen
        learned = Learned.NOTHING
        if (n & (n - 1) == 0 and n < self.refresh_every) or n % self.refresh_every == 0:
            learned = self._refresh()
        if learned or not (self.cpu_ratio or self.memory_ratio):
            ratios = self._host.ratios()
            if ratios != (self.cpu_ratio, self.memory_ratio):
                self.cpu_ratio, self.memory_ratio = ratios
                if not learned:
                    self.generation += 1
                learned |= Learned.HOST
        return learned

    def _rescale(self) -> None:
        for d in (self._hist, self._mig_hist):
            for k in d:
                d[k] /= self._inc  # type: ignore[index]
        self._host.scale(1.0 / self._inc)
        self._inc = 1.0

    def _refresh(self) -> Learned:
        learned = Learned.NOTHING
        total = sum(self._hist.values())
        if total > 0:
            ranked = sorted(self._hist.items(), key=lambda kv: -kv[1])
            dist: dict[Shape, float] = {}
            cum = 0.0
            for shape, w in ranked:
                if cum >= self.coverage * total:
                    break
                dist[shape] = w
                cum += w
            dist = {s: w / cum for s, w in dist.items()}
            if _moved(dist, self.distribution) > self.drift:
                self.distribution = dist
                self.generation += 1
                learned |= Learned.SHAPES
        mig_total = sum(self._mig_hist.values())
        if mig_total > 0:
            mig_dist = {k: w / mig_total for k, w in self._mig_hist.items()}
            if _moved(mig_dist, self.mig_distribution) > self.drift:
                self.mig_distribution = mig_dist
                self.generation += 1
                learned |= Learned.MIG
        return learned


def _moved(new: Mapping[K, float], old: Mapping[K, float]) -> float:
    """Total variation distance between two distributions."""
    return 0.5 * sum(abs(new.get(k, 0.0) - old.get(k, 0.0)) for k in set(new) | set(old))
