"""Host stranding: the GPU milli a node's free CPU and memory could not feed.

A GPU is only usable while its node still has the CPU and memory its pods ask for. FGD's ``F``
(fragmentation.py) notices the host only when it is already too short for the next request;
the **host deficit** looks at the future fill. Pods that use GPUs ask, on average, ``c`` CPU
milli and ``m`` MiB of memory per GPU milli (learned from the requests seen, ``HostDemand``);
a node with ``idle`` GPU milli, ``cpu_free`` and ``mem_free`` left can feed
``min(cpu_free / c, mem_free / m)`` milli of such demand, and whatever idle milli lies beyond
that stays idle however well the shares pack:

    D(node) = max(0, idle − min(cpu_free / c, mem_free / m))

One deficit for both resources, not one per resource: a node short of CPU *and* memory strands
its idle GPU once, and adding the two separately counted it twice (measured on openb: a
separate memory deficit beside the CPU one gained nothing on seeds 42–44; the joint one lowers
the unallocated GPU by 0.04 points over seeds 42–51, 4.10 → 4.06 % at 100 % arrived).

Example, a G2 node of the openb trace (8 GPUs, 96 cores, 384 GiB) against the openb mix
(c = 10.9, m = 41.1 MiB per milli, i.e. 41 GiB per GPU): empty, it feeds min(8 807, 9 567) →
D = 0. After a CPU-only pod of 17 cores and 50 GiB: min(79 000 / 10.9, 334 GiB / 41.1) =
min(7 248, 8 322) → D = 752. The same pod on a T4 node (2 GPUs, 104 cores, 512 GiB) leaves
D = 0 — so CPU- and memory-heavy pods go where CPU and memory are spare, and the G2 GPUs keep
the host they will need.

``HostGain`` is gpuportal's host term: ``D(node) − D(node after the option)``, in the same GPU
milli as the fragmentation term (in the example: 0 − 752 = −752 for the G2 node, 0 for the T4).
"""

from __future__ import annotations

import math

from policies.flavors import MILLI_PER_GPU, FlavorKind
from policies.placement.scorers.fragmentation import StateKey
from policies.placement.state import NodeState, Placement
from policies.requests import DeviceRequest


class HostDemand:
    """Weighted sums of the CPU, memory and GPU milli asked by GPU-using requests.

    Whole GPUs and shares count; CPU-only and MIG requests do not (a CPU-only pod's host use
    is not a need of the GPUs; MIG slots are scored apart). Weights are the caller's decay
    increments, so the ratios follow the recent mix; ``scale`` rescales the sums when the
    caller restarts its increments.
    """

    __slots__ = ("_cpu", "_mem", "_milli")

    def __init__(self) -> None:
        self._cpu = 0.0
        self._mem = 0.0
        self._milli = 0.0

    def add(self, req: DeviceRequest, weight: float) -> None:
        """Count ``req`` with ``weight`` (ignored unless it asks for whole GPUs or a share)."""
        if req.kind is FlavorKind.GPU:
            milli = req.count * MILLI_PER_GPU
        elif req.kind is FlavorKind.SHARE:
            milli = req.milli
        else:
            return
        self._cpu += weight * req.cpu_milli
        self._mem += weight * req.memory_mib
        self._milli += weight * milli

    def scale(self, factor: float) -> None:
        """Multiply every sum by ``factor`` (ratios unchanged)."""
        self._cpu *= factor
        self._mem *= factor
        self._milli *= factor

    def ratios(self) -> tuple[float, float]:
        """(CPU milli, memory MiB) asked per GPU milli; (0, 0) before any GPU request.

        Example: one whole GPU with 12 000m CPU and 48 GiB, and a 500-milli share with 2 000m
        and 16 GiB, equally weighted: CPU (12 000 + 2 000) / 1 500 = 9.33, memory
        (49 152 + 16 384) / 1 500 = 43.7 MiB per milli.
        """
        if self._milli <= 0:
            return 0.0, 0.0
        return self._cpu / self._milli, self._mem / self._milli


def host_deficit(key: StateKey, mem_free: int, cpu_ratio: float, mem_ratio: float) -> float:
    """Idle GPU milli the node's free CPU and memory cannot feed at the given ratios.

    ``key`` is ``fragmentation.state_key`` (CPU free, model, free milli of the non-MIG GPUs);
    ``mem_free`` the node's free memory in MiB. A ratio of 0 (the requests seen ask for none of
    that resource) does not bound the feed; both 0: nothing is stranded. Example: 8 idle GPUs,
    79 000m CPU and 342 016 MiB free, ratios 10.9 and 41.1 → min(7 248, 8 322) milli fed →
    752 stranded; with ratios 10.9 and 0 → 752 as well; 0 and 41.1 → 8 000 − 8 322 → 0.
    """
    fed = math.inf
    if cpu_ratio > 0:
        fed = key[0] / cpu_ratio
    if mem_ratio > 0:
        fed = min(fed, mem_free / mem_ratio)
    if fed == math.inf:
        return 0.0
    return max(0.0, sum(key[2]) - fed)


class HostGain:
    """gpuportal's host term: the drop of ``host_deficit`` an option causes, in GPU milli.

    ``cpu_ratio``/``memory_ratio``: CPU milli and memory MiB per GPU milli of the demand to
    feed (``HostDemand.ratios``); both 0 (nothing learned yet): the term is 0 everywhere.
    """

    name = "host"

    def __init__(self, cpu_ratio: float = 0.0, memory_ratio: float = 0.0) -> None:
        self.cpu_ratio = cpu_ratio
        self.memory_ratio = memory_ratio

    def gain(self, st: NodeState, option: Placement, before: StateKey, after: StateKey) -> float:
        rc, rm = self.cpu_ratio, self.memory_ratio
        return host_deficit(before, st.mem_free, rc, rm) - host_deficit(
            after, st.mem_free - option.memory_mib, rc, rm
        )
