"""Expected GPU fragmentation of a node against a distribution of request shapes (FGD's F).

From Weng et al., "Beware of Fragmentation" (USENIX ATC 2023): for a request shape ``m``, the
fragment ``F_m(node)`` is the idle GPU milli that ``m`` cannot use there —

- all idle milli when ``m`` is CPU-only, its model is not on the node, its CPU does not fit,
  or its GPUs do not fit (fewer than ``m.count`` GPUs with ``m.milli`` free);
- otherwise the idle milli on GPUs whose free share is below ``m.milli``.

``F(node) = Σ_m p_m · F_m(node)``. Example: a node with free shares (1000, 300) and 8 CPUs free,
against {1 GPU: 0.5, 0.5 GPU: 0.5}: the whole GPU fits and strands the 300 (F = 300); the
half fits on GPU 0 and strands the 300 too (F = 300); F = 0.5·300 + 0.5·300 = 300.

Values depend only on (CPU free, model, sorted free milli), so they are memoised on that key.
The host side of the same question, for the future fill rather than the next request, is
``host.host_deficit``.

``FragmentationGain`` is gpuportal's fragmentation term: ``Δ = F(node) − F(node after)``, the
GPU milli an option *saves* from being stranded (negative: it strands more). Example, same mix
and node: a 0.2 share on GPU 1 leaves (1000, 100): the whole GPU strands 100, the half 100,
F = 100, Δ = 300 − 100 = 200; on GPU 0 it leaves (800, 300): F stays 300, Δ = 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from policies.flavors import MILLI_PER_GPU, FlavorKind
from policies.placement.state import NodeState, Placement
from policies.requests import DeviceRequest

# (CPU free, GPU model, free milli of the non-MIG GPUs sorted descending): all F depends on.
StateKey = tuple[int, str, tuple[int, ...]]

# Memo entries kept before the memo is cleared (bounds memory in a long-running allocator).
MEMO_LIMIT = 200_000


@dataclass(frozen=True, slots=True)
class Shape:
    """A request shape as fragmentation sees it: CPU, GPUs, per-GPU milli, allowed models.

    CPU-only: ``count`` 0 and ``milli`` 0; a share: ``count`` 1 and ``milli`` < 1000.
    """

    cpu_milli: int
    milli: int
    count: int
    models: frozenset[str] = frozenset()

    @classmethod
    def of(cls, req: DeviceRequest) -> Shape | None:
        """The shape of a request; None for MIG (fragmentation of MIG slots is separate)."""
        if req.kind is None:
            return cls(req.cpu_milli, 0, 0, req.models)
        if req.kind is FlavorKind.GPU:
            return cls(req.cpu_milli, MILLI_PER_GPU, req.count, req.models)
        if req.kind is FlavorKind.SHARE:
            return cls(req.cpu_milli, req.milli, 1, req.models)
        return None


def state_key(st: NodeState) -> StateKey:
    """(CPU free, model, free milli of non-MIG GPUs sorted descending) of a node now."""
    frees = tuple(
        sorted(
            (m for m, g in zip(st.free_milli, st.node.gpus, strict=True) if not g.mig_enabled),
            reverse=True,
        )
    )
    return st.cpu_free, st.model, frees


def key_after(st: NodeState, p: Placement) -> StateKey:
    """The state key ``st`` would have after taking ``p``."""
    free = list(st.free_milli)
    if p.mig_profile is None:
        for g in p.gpus:
            free[g] -= p.milli
    frees = tuple(
        sorted(
            (m for m, g in zip(free, st.node.gpus, strict=True) if not g.mig_enabled), reverse=True
        )
    )
    return st.cpu_free - p.cpu_milli, st.model, frees


class FragModel:
    """F(node) for a fixed distribution of shapes (frequencies are normalised to sum 1)."""

    def __init__(self, typical: Iterable[tuple[Shape, float]]) -> None:
        pairs = [(s, w) for s, w in typical if w > 0]
        total = sum(w for _, w in pairs)
        self.typical: tuple[tuple[Shape, float], ...] = (
            tuple((s, w / total) for s, w in pairs) if total > 0 else ()
        )
        self._memo: dict[StateKey, float] = {}

    def value(self, key: StateKey) -> float:
        got = self._memo.get(key)
        if got is not None:
            return got
        cpu_free, model, frees = key
        idle = sum(frees)
        f = 0.0
        if idle:
            for m, p in self.typical:
                f += p * _fragment(m, cpu_free, model, frees, idle)
        if len(self._memo) >= MEMO_LIMIT:
            self._memo.clear()
        self._memo[key] = f
        return f

    def node(self, st: NodeState) -> float:
        return self.value(state_key(st))

    def after(self, st: NodeState, p: Placement) -> float:
        return self.value(key_after(st, p))


class FragmentationGain:
    """gpuportal's fragmentation term: ``F(node) − F(node after the option)`` in GPU milli.

    ``before``/``after`` are ``state_key(st)`` and ``key_after(st, option)``, computed once by
    the caller for all terms.
    """

    name = "fragmentation"

    def __init__(self, typical: Iterable[tuple[Shape, float]]) -> None:
        self.model = FragModel(typical)

    def gain(self, st: NodeState, option: Placement, before: StateKey, after: StateKey) -> float:
        return self.model.value(before) - self.model.value(after)


def _fragment(m: Shape, cpu_free: int, model: str, frees: Sequence[int], idle: int) -> int:
    if m.count == 0 or (m.models and model not in m.models) or cpu_free < m.cpu_milli:
        return idle
    fit = 0
    stranded = 0
    for f in frees:
        if f >= m.milli:
            fit += 1
        else:
            stranded += f
    return stranded if fit >= m.count else idle
