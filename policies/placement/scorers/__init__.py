"""Placement scorers, one idea per module, and the named policies built from them.

``policy(name, **options)`` builds a fresh policy (scorers may keep learned state). Options
a policy does not use are ignored: ``typical`` (FGD's request-shape distribution, a sequence of
``(Shape, frequency)``) and ``rng`` (the Random baseline's ``random.Random``).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from policies.errors import InvalidRequest
from policies.placement.framework import Policy
from policies.placement.scorers.bestfit import BestFit
from policies.placement.scorers.binpack import BinPack
from policies.placement.scorers.dotprod import DotProd
from policies.placement.scorers.fgd import FGD
from policies.placement.scorers.fragmentation import Shape
from policies.placement.scorers.gpu_packing import GpuPacking
from policies.placement.scorers.gpuportal import GpuPortal
from policies.placement.scorers.random_fit import RandomFit
from policies.placement.scorers.topology import TopologyFit

DEFAULT_POLICY = "gpuportal"


def _fgd(typical: Sequence[tuple[Shape, float]] = (), **_: Any) -> Policy:
    return Policy("fgd", [(FGD(typical), 1.0)])


def _random(rng: random.Random | None = None, **_: Any) -> Policy:
    return Policy("random", [(RandomFit(rng if rng is not None else random.Random(0)), 1.0)])


POLICIES: dict[str, Callable[..., Policy]] = {
    # The portal's default: fragmentation-, topology- and MIG-aware, learns its request mix.
    "gpuportal": lambda **_: Policy("gpuportal", [(GpuPortal(), 1.0)]),
    # Simple packing (fullest node first) with topology preference; kept for small clusters
    # and as the baseline to compare with; not the default.
    "binpack": lambda **_: Policy("binpack", [(TopologyFit(), 1.0), (BinPack(), 1.0)]),
    # The published baselines of Weng et al. (ATC 2023), as their simulator implements them.
    "random": _random,
    "dotprod": lambda **_: Policy("dotprod", [(DotProd(), 1.0)]),
    "gpupacking": lambda **_: Policy("gpupacking", [(GpuPacking(), 1.0)]),
    "bestfit": lambda **_: Policy("bestfit", [(BestFit(), 1.0)]),
    "fgd": _fgd,
}


def policy(name: str, **options: Any) -> Policy:
    """A fresh instance of the named policy (scorers may keep learned state)."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise InvalidRequest(
            "placement policy", name, "one of " + ", ".join(sorted(POLICIES))
        ) from None
    return factory(**options)
