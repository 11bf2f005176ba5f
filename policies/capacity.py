"""Capacity per flavor, in each flavor's unit, from the inventory.

- a whole-GPU flavor counts the model's GPUs that are not MIG-enabled;
- a share flavor counts 1000 milli per shareable GPU of the model;
- a MIG flavor counts the instances of that profile that exist, plus, on reconfigurable nodes,
  how many more could be created on GPUs whose layout is empty.

A shareable GPU is counted both as a whole GPU and as 1000 milli of share: it can be handed out
either way, and quotas bound what each tenant may take of each.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from policies import mig
from policies.flavors import MILLI_PER_GPU, Flavor, FlavorKind
from policies.inventory import Node


def flavor_capacity(nodes: Iterable[Node]) -> dict[str, int]:
    """Capacity of every flavor the nodes offer, keyed by canonical flavor name."""
    cap: Counter[str] = Counter()
    for node in nodes:
        for g in node.gpus:
            if g.mig_enabled:
                for inst in g.mig_layout:
                    cap[str(Flavor(FlavorKind.MIG, g.model, inst.profile))] += 1
                if node.mig_reconfigurable and not g.mig_layout:
                    geom = mig.geometry(g.model)
                    for p in geom.profiles.values():
                        per_gpu = min(
                            len(p.placements),
                            geom.compute_slices // p.compute_slices,
                            p.max_per_gpu or len(p.placements),
                        )
                        cap[str(Flavor(FlavorKind.MIG, g.model, p.name))] += per_gpu
                continue
            cap[str(Flavor(FlavorKind.GPU, g.model))] += 1
            if g.shareable:
                cap[str(Flavor(FlavorKind.SHARE, g.model))] += MILLI_PER_GPU
    return dict(cap)
