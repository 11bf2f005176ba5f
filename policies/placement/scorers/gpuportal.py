"""gpuportal: the portal's default scorer — fragmentation-aware on the request mix it has seen.

Per node it scores every option (each distinct GPU for a share, the topology-chosen set for
whole GPUs, each slot for MIG) and keeps the best:

1. **Fragmentation** (the FGD idea, Weng et al. 2023): ``Δ = F(node) − F(node after)``, where
   ``F`` is the GPU milli expected to be stranded for the request shapes the allocator has seen
   recently (``observe``: a histogram decayed with a half-life of ``half_life`` requests,
   failed requests included since they are demand too). Δ is rounded to ``quantum`` milli
   (200) before scoring: candidates within one step tie and go to the first node in the
   cluster's fixed order, which packs load onto a stable prefix of nodes and keeps the rest
   whole for large requests (measured on openb: finer steps, down to FGD's ~40 milli, and
   coarser ones, 500, both strand more GPU).
   **Host stranding** joins Δ in the same milli unit: ``D(node) − D(node after)`` with
   ``D = host_deficit`` (host.py), the idle GPU milli the node's free CPU and memory could not
   feed at the CPU and memory per GPU milli that the GPU-using requests seen ask for
   (``HostDemand``, decayed like the histogram). FGD's ``F`` only sees the host when it is
   already too short for the next request; ``D`` sees that a CPU-only pod of 17 cores and
   50 GiB on an empty 8-GPU node with 96 cores and 384 GiB (openb mix: 10.9 CPU milli and
   41 MiB per GPU milli) leaves CPU for only 7 248 of its 8 000 milli, while a 2-GPU node with
   104 cores and 512 GiB loses nothing — so CPU- and memory-heavy pods go where the host is
   spare and GPUs keep the CPU and memory they will need. Measured on openb (10 seeds): CPU
   alone took 4.87 → 4.19 % of GPU unallocated at 100 % arrived (FGD 4.80); counting memory
   too, 4.10 → 4.06 (4.02 → 3.99 at 130 %).
   **Leftover of partly used GPUs** orders what that coarse Δ ties: ``L(node) − L(after)``
   with ``L`` (leftover.py) the idle milli the learned share mix is expected to leave on the
   node's partly used GPUs once it has filled them — a 470 share goes into a 530 free share
   (leaving 60) rather than opening a fresh GPU or taking a 650 free share (leaving 180 that
   few requests fit). ``F`` only asks whether the next request fits. It is added after the
   rounding, weighted 0.2 (a leftover difference of 500 milli moves Δ by half a step), so it
   reorders near-ties without undoing the node-order packing. Measured on openb (10 seeds):
   4.19 → 4.10 % unallocated at 100 % arrived, 4.11 → 4.02 at 130 %. ``V`` counts a free
   share as taken once at least 1 in ``leftover_patience`` (20) share requests fits it, not
   only when the next one does. The next-request view rated a free share that the next
   request may not fit as lost and so liked to fill any free share; with patience it steers
   away from leaving what only rare sizes fit: on openb a 230 share no longer takes a 650
   share's 350 free milli (leaving 120, which only the rare ≤ 110 shares fit) but joins a lone
   470 or 230, and the 350 goes to a 320 (leaving 30); seed 46 by 100 % arrived: 213 instead
   of 160 of 337 320s went next to a 650, 16 instead of 58 of 143 230s. Measured on openb
   (10 seeds): 4.06 → 3.97 % unallocated at 100 % arrived, 3.99 → 3.88 at 130 %, better on
   every seed.
2. **Topology**, ahead of fragmentation for multi-GPU options: they rank by the weakest link of
   the set the device chooser picked on the node (NVSwitch > NVLink > PCIe switch > … > cross
   socket), then by whether the set sits on one socket (NUMA node); fragmentation only orders
   options of equal rank. A better link or a one-socket set is never traded for less stranded
   capacity (measured on the topology benchmark: 100 % of multi-GPU requests on the best free
   link class, none split across sockets while an as-well-linked one-socket set was free).
3. **MIG**: an instance goes where the parent's remaining free slots still fit the most of
   the recently seen MIG profiles (weighted by frequency), existing instances before new ones.

Single devices and CPU-only options score ``100 · (0.8 · frag + 0.2)`` with
``frag = sigmoid(Δ / 1000)`` in (0, 1); multi-GPU options ``100 · (0.95 · rank / 13 + 0.05 ·
frag)`` with ``rank = 2 · link class + one-socket`` (at most 2 · 6 + 1 = 13). Example: on a
node with free shares (1000, 300) against {0.5 GPU: 1}, a 0.2 share on GPU 1 leaves
(1000, 100): F goes 300 → 100, Δ = 200; L goes 300 → 100 (no 0.5 share fits either), + 0.2 ·
200 → Δ = 240, score = 100 · (0.8 · sigmoid(0.24) + 0.2) = 64.78. On GPU 0 it leaves (800,
300): F stays 300, Δ = 0; L goes 300 → 600 (the 800 takes one 0.5 share and keeps 300), + 0.2
· (−300) → Δ = −60, score = 100 · (0.8 · sigmoid(−0.06) + 0.2) = 58.80 — GPU 1 wins.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from policies import mig
from policies.flavors import MILLI_PER_GPU
from policies.placement.scorers.fragmentation import FragModel, Shape, key_after, state_key
from policies.placement.scorers.host import HostDemand, host_deficit
from policies.placement.scorers.leftover import LeftoverModel
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest
from policies.topology import LinkClass

# Shapes assumed before anything was observed: whole GPUs of every usual count and a share.
PRIOR: tuple[tuple[Shape, float], ...] = (
    (Shape(0, MILLI_PER_GPU, 1), 0.4),
    (Shape(0, 500, 1), 0.3),
    (Shape(0, MILLI_PER_GPU, 2), 0.1),
    (Shape(0, MILLI_PER_GPU, 4), 0.1),
    (Shape(0, MILLI_PER_GPU, 8), 0.1),
)


# Multi-GPU options rank by 2 · link class + one-socket (at most 2 · NVSWITCH + 1 = 13);
# fragmentation only orders options of equal rank: its weight is below one rank step,
# 0.05 < (1 - 0.05) / 13.
_RANKS = 2 * int(LinkClass.NVSWITCH) + 1
_FRAG_TIEBREAK = 0.05


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


class GpuPortal:
    """Fragmentation-, topology- and MIG-aware scorer learning from ``observe``.

    ``half_life``: requests after which an observation weighs half. ``coverage``: the most
    frequent shapes covering this share of the (decayed) mass form the distribution.
    ``refresh_every``/``drift``: the distribution is re-derived at most every
    ``refresh_every`` requests (and at 1, 2, 4, … before that), and only adopted when it moved
    by more than ``drift`` in total variation — each adoption invalidates cached scores.
    Defaults measured on openb (10 seeds): half-life 20 000 and drift 0.02 strand 0.10 points
    less GPU than 4 000 and 0.08 (the mix is learned more accurately). ``quantum``: Δ's
    rounding step; ``weight_host``/``weight_leftover``: the host-deficit and leftover terms
    (0 turns one off); ``leftover_patience``: see ``leftover.LeftoverModel`` (1: only the next
    request counts).
    """

    name = "gpuportal"

    def __init__(
        self,
        half_life: float = 20000.0,
        coverage: float = 0.95,
        refresh_every: int = 1024,
        drift: float = 0.02,
        weight_frag: float = 0.8,
        quantum: float = 200.0,
        weight_host: float = 1.0,
        weight_leftover: float = 0.2,
        leftover_patience: float = 20.0,
    ) -> None:
        self.quantum = quantum
        self.weight_host = weight_host
        self.weight_leftover = weight_leftover
        self.decay = 0.5 ** (1.0 / half_life)
        self.coverage = coverage
        self.refresh_every = refresh_every
        self.drift = drift
        self.weight_frag = weight_frag
        self._hist: dict[Shape, float] = {}
        self._mig_hist: dict[tuple[str, str], float] = {}
        self._inc = 1.0
        self._seen = 0
        self._generation = 0
        self._dist: dict[Shape, float] = dict(PRIOR)
        self.frag = FragModel(PRIOR)
        self.leftover_patience = leftover_patience
        self.leftover = LeftoverModel(PRIOR, leftover_patience)
        # CPU milli and memory MiB per GPU milli of the GPU-using requests seen (0: none yet).
        self.host = HostDemand()
        self.cpu_ratio = 0.0
        self.memory_ratio = 0.0
        self._mig_dist: dict[tuple[str, str], float] = {}

    # -- learning ------------------------------------------------------------------------

    def observe(self, req: DeviceRequest, placement: Placement | None) -> None:
        self.host.add(req, self._inc)
        shape = Shape.of(req)
        if shape is not None:
            self._hist[shape] = self._hist.get(shape, 0.0) + self._inc
        elif req.mig_profile is not None:
            for model in req.models:
                key = (model, req.mig_profile)
                self._mig_hist[key] = self._mig_hist.get(key, 0.0) + self._inc
        # Growing increments instead of shrinking every weight: same ratios, O(1) per request.
        self._inc /= self.decay
        if self._inc > 1e100:
            self._rescale()
        self._seen += 1
        n = self._seen
        generation = self._generation
        if (n & (n - 1) == 0 and n < self.refresh_every) or n % self.refresh_every == 0:
            self._refresh()
        # Host ratios follow each adopted distribution (and the first GPU request), so they
        # change only when cached scores are invalidated anyway.
        if self._generation != generation or not (self.cpu_ratio or self.memory_ratio):
            ratios = self.host.ratios()
            if ratios != (self.cpu_ratio, self.memory_ratio):
                self.cpu_ratio, self.memory_ratio = ratios
                if self._generation == generation:
                    self._generation += 1

    def _rescale(self) -> None:
        for d in (self._hist, self._mig_hist):
            for k in d:
                d[k] /= self._inc  # type: ignore[index]
        self.host.scale(1.0 / self._inc)
        self._inc = 1.0

    def _refresh(self) -> None:
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
            moved = 0.5 * sum(
                abs(dist.get(s, 0.0) - self._dist.get(s, 0.0)) for s in set(dist) | set(self._dist)
            )
            if moved > self.drift:
                self._dist = dist
                self.frag = FragModel(dist.items())
                self.leftover = LeftoverModel(dist.items(), self.leftover_patience)
                self._generation += 1
        mig_total = sum(self._mig_hist.values())
        if mig_total > 0:
            mig_dist = {k: w / mig_total for k, w in self._mig_hist.items()}
            moved = 0.5 * sum(
                abs(mig_dist.get(k, 0.0) - self._mig_dist.get(k, 0.0))
                for k in set(mig_dist) | set(self._mig_dist)
            )
            if moved > self.drift:
                self._mig_dist = mig_dist
                self._generation += 1

    def cache_token(self) -> int:
        return self._generation

    @property
    def distribution(self) -> dict[Shape, float]:
        """The request-shape distribution scores use now."""
        return dict(self._dist)

    # -- scoring -------------------------------------------------------------------------

    def score(
        self, req: DeviceRequest, st: NodeState, option: Placement, cluster: ClusterState
    ) -> float:
        if option.mig_profile is not None:
            return self._mig(st, option)
        before, after = state_key(st), key_after(st, option)
        delta = self.frag.value(before) - self.frag.value(after)
        if self.weight_host:
            rc, rm = self.cpu_ratio, self.memory_ratio
            delta += self.weight_host * (
                host_deficit(before, st.mem_free, rc, rm)
                - host_deficit(after, st.mem_free - option.memory_mib, rc, rm)
            )
        if self.quantum > 0:
            delta = self.quantum * round(delta / self.quantum)
        if self.weight_leftover and not self.leftover.empty:
            # After rounding: it orders options the coarse Δ ties, keeping the node-order
            # packing that the rounding buys (see the module docstring).
            delta += self.weight_leftover * (
                self.leftover.value(before) - self.leftover.value(after)
            )
        frag = _sigmoid(delta / 1000.0)
        if len(option.gpus) <= 1:  # one device, or CPU only
            return 100.0 * (self.weight_frag * frag + (1 - self.weight_frag))
        # Multi-GPU: link class first, then "on one socket", then fragmentation. The rank
        # steps (1/_RANKS of the range) are wider than the whole fragmentation term, so no
        # fragmentation gain buys a worse link or a socket split.
        topo = st.node.link_topology
        worst = topo.worst_link(option.gpus)
        one_socket = len({topo.numa[g] for g in option.gpus}) == 1
        rank = (2 * int(worst) + int(one_socket)) / _RANKS
        return 100.0 * ((1 - _FRAG_TIEBREAK) * rank + _FRAG_TIEBREAK * frag)

    def score_node(
        self,
        req: DeviceRequest,
        st: NodeState,
        options: Sequence[Placement],
        cluster: ClusterState,
    ) -> tuple[float, Placement] | None:
        best = options[0]
        best_score = self.score(req, st, best, cluster)
        for opt in options[1:]:
            sc = self.score(req, st, opt, cluster)
            if sc > best_score:
                best, best_score = opt, sc
        return best_score, best

    def _mig(self, st: NodeState, option: Placement) -> float:
        """Share of recent MIG demand the parent can still serve after this instance."""
        (g,) = option.gpus
        model = st.node.gpus[g].model
        layout = list(st.mig_layout[g])
        free = set(st.mig_free[g])
        assert option.mig_profile is not None and option.mig_start is not None
        if option.mig_created:
            layout.append(mig.MigInstance(option.mig_profile, option.mig_start))
        else:
            free.discard(option.mig_start)
        geom = mig.geometry(model)
        weights = {p: w for (m, p), w in self._mig_dist.items() if m == model}
        if not weights:
            weights = {option.mig_profile: 1.0}
        total = sum(weights.values())
        serve = 0.0
        for profile, w in weights.items():
            existing = any(i.profile == profile and i.start in free for i in layout)
            creatable = st.node.mig_reconfigurable and any(
                True for _ in mig.free_starts(geom, profile, layout)
            )
            if existing or creatable:
                serve += w
        keep = 0.0 if option.mig_created else 1.0
        # Fuller parents first (fewer free instances left), as bin packing of slices.
        left = sum(len(f) for f in st.mig_free) / max(1, sum(len(x) for x in st.mig_layout))
        return 100.0 * (0.7 * serve / total + 0.2 * keep + 0.1 * (1 - left))
