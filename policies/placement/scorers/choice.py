"""Within-node device rules the published baselines share (Weng et al.'s simulator).

- shares go best-fit: the GPU with the smallest sufficient free share, lowest index on ties;
- whole GPUs go to the lowest-index fully free GPUs (the device chooser's order when the node's
  topology is unknown, and its topology-aware choice otherwise).
"""

from __future__ import annotations

from collections.abc import Sequence

from policies.placement.state import NodeState, Placement


def best_fit(st: NodeState, options: Sequence[Placement]) -> Placement:
    """The option whose GPU has the least free milli (first listed on ties)."""
    if len(options) == 1 or options[0].mig_profile is not None or len(options[0].gpus) != 1:
        return options[0]
    free = st.free_milli
    best = options[0]
    for opt in options[1:]:
        if free[opt.gpus[0]] < free[best.gpus[0]]:
            best = opt
    return best


def requested_milli(option: Placement) -> int:
    """GPU milli the option takes in total (0 for CPU-only and MIG)."""
    if option.mig_profile is not None:
        return 0
    return option.milli * len(option.gpus)
