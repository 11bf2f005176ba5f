"""Expected leftover of partly used GPUs: the idle milli the share mix will never fill.

FGD's ``F`` (fragmentation.py) asks whether the *next* request fits a GPU's free share. This
asks where that free share ends up as GPU-share requests keep arriving. ``Q(r)`` is the part of
share requests no larger than ``r``, ``q_s`` the frequency of size ``s`` among them. A free
share of ``r`` milli is taken at some point with probability ``p(r)``, by a request drawn from
those that fit, which leaves ``r − s``; otherwise it stays idle:

    V(r) = (1 − p(r)) · r + p(r) · Σ_{s ≤ r} (q_s / Q(r)) · V(r − s)
    p(r) = min(1, patience · Q(r))

``patience`` 1 is the chance that the *next* share request fits (``p = Q``). But requests keep
arriving, so a free share that common sizes fit is taken sooner or later, while one that only
rare sizes fit (the 190 milli an 810 share leaves: about 1 in 30 openb share requests is that
small) competes with many like it for few requests. ``patience`` k counts a free share as
certainly taken once at least 1 in k share requests fits it, and in proportion below that (a
first-order 1 − (1 − Q)^k, capped). Measured on openb (10 seeds, as gpuportal's term; see
docs/decisions/0007-gpuportal-scorer.md): patience 20 lowers the unallocated GPU from 4.06 to
3.97 % at 100 % arrived (3.99 → 3.88 at 130 %) against patience 1. In one-dimensional
replays of the openb shares (sizes only, seeds 42–51, patience 1) choosing the free share that
lowers ``Σ V`` most leaves 4.17 % of the GPUs idle where best fit leaves 4.31 %.

``V`` deliberately ignores the node's CPU and GPU model: counting only the shares a node could
take makes gaps on popular models look cheap and draws unconstrained shares onto the GPUs that
model-constrained requests need (measured on the *typed* openb variant, seeds 42–44: 12.1 → 17.2 %
idle at 100 % arrived).

Example: mix {470: 0.5, 810: 0.5}. V(60) = 60 (nothing fits). With patience 1, V(530) = 0.5 ·
530 + 0.5 · V(60) = 295: a 470 share placed into a 530 free share lowers the node's leftover by
295 − 60 = 235, on a fully free GPU it raises it by V(530) = 295 — the pairing that leaves 60,
not 530. With patience 20, V(530) = V(60) = 60 (half the share requests fit a 530, so a 470 will
come), while V(190) = 190 either way: what the term then steers away from is leaving free shares
that only rare sizes fit.

Fully free GPUs do not count (they are whole-GPU capacity, which ``F`` already values).

``LeftoverGain`` is gpuportal's leftover term: ``L(node) − L(node after the option)`` with
``L = Σ V`` over the partly used GPUs. In the example (patience 1), a 470 share into a 530 free
share gains 295 − 60 = 235; on a fully free GPU it gains 0 − V(530) = −295.
"""

from __future__ import annotations

from collections.abc import Iterable

from policies.errors import InvalidRequest
from policies.flavors import MILLI_PER_GPU
from policies.placement.scorers.fragmentation import Shape, StateKey
from policies.placement.state import NodeState, Placement


class LeftoverModel:
    """``L(node) = Σ V(free)`` over the node's partly used GPUs, for a distribution of shapes.

    Only share shapes (one GPU, 1…999 milli) matter; frequencies are normalised over them and
    shapes of equal size are merged. ``patience`` (≥ 1): a free share that at least 1 in
    ``patience`` share requests fits counts as taken (see the module docstring). ``V`` is
    memoised as it is asked for.
    """

    def __init__(self, typical: Iterable[tuple[Shape, float]], patience: float = 1.0) -> None:
        if not patience >= 1:
            raise InvalidRequest("leftover patience", patience, "a number of at least 1")
        self.patience = patience
        sizes: dict[int, float] = {}
        for s, w in typical:
            if w > 0 and s.count == 1 and 0 < s.milli < MILLI_PER_GPU:
                sizes[s.milli] = sizes.get(s.milli, 0.0) + w
        total = sum(sizes.values())
        self._sizes = sorted((m, w / total) for m, w in sizes.items())
        self._memo: dict[int, float] = {0: 0.0}

    @property
    def empty(self) -> bool:
        """True when the distribution has no share shapes (then ``L`` orders nothing)."""
        return not self._sizes

    def leftover(self, free: int) -> float:
        """``V(free)``: the milli of a ``free`` share the mix is expected to leave idle."""
        memo, sizes = self._memo, self._sizes
        # Iterative depth-first evaluation: V(r) needs V(r − s) for every fitting s first
        # (recursion could be 1000 deep for 1-milli shares).
        stack = [free]
        while stack:
            r = stack[-1]
            if r in memo:
                stack.pop()
                continue
            missing = [r - m for m, _ in sizes if m <= r and r - m not in memo]
            if missing:
                stack.extend(missing)
                continue
            q_fit = refill = 0.0
            for m, q in sizes:
                if m > r:
                    break
                q_fit += q
                refill += q * memo[r - m]
            if q_fit > 0:
                # refill / q_fit: the expected leftover once a request that fits has taken r.
                fill = min(1.0, self.patience * q_fit)
                memo[r] = (1.0 - fill) * r + fill * refill / q_fit
            else:
                memo[r] = float(r)
            stack.pop()
        return memo[free]

    def value(self, key: StateKey) -> float:
        """``L`` of a node state key (see ``fragmentation.state_key``)."""
        return sum(self.leftover(f) for f in key[2] if 0 < f < MILLI_PER_GPU)


class LeftoverGain:
    """gpuportal's leftover term: the drop of ``L`` an option causes, in GPU milli."""

    name = "leftover"

    def __init__(self, typical: Iterable[tuple[Shape, float]], patience: float) -> None:
        self.model = LeftoverModel(typical, patience)

    @property
    def empty(self) -> bool:
        """True when the mix has no shares: the term is 0 everywhere and can be skipped."""
        return self.model.empty

    def gain(self, st: NodeState, option: Placement, before: StateKey, after: StateKey) -> float:
        return self.model.value(before) - self.model.value(after)
