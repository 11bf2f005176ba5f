"""MIG slot score: how much of the recent MIG demand the parent GPU still serves afterwards.

For a MIG option (an instance of one profile on one parent GPU), in [0, 100]:

    score = 100 · (SERVE · served + KEEP · existing + FULLER · (1 − free share))

- ``served``: the share of the recently seen MIG requests for the parent's model (weighted by
  frequency; just the asked profile before any were seen) that the parent can still serve
  after this instance — a free instance of the profile, or, on a reconfigurable node, room to
  create one;
- ``existing``: 1 when the option takes an instance that already exists, 0 when it creates
  one (existing instances first: creating one means reconfiguring the GPU);
- ``free share``: the node's free instances over all its instances, before this one, so fuller
  parents go first (bin packing of slices).

gpuportal's weights: SERVE 0.7, KEEP 0.2, FULLER 0.1 — serving the mix matters most, then not
reconfiguring, then packing. Example, a reconfigurable A100-40GB with an empty layout and
demand {1g.5gb: 0.5, 7g.40gb: 0.5}: a new 1g.5gb at slot 0 leaves no room for a 7g.40gb but
for more 1g.5gb → served 0.5, existing 0, free share 0 (the node has no instances yet) →
score = 100 · (0.7 · 0.5 + 0.2 · 0 + 0.1 · (1 − 0)) = 45.
"""

from __future__ import annotations

from collections.abc import Mapping

from policies import mig
from policies.placement.state import NodeState, Placement


class MigSlots:
    """Scores MIG options against a (model, profile) → frequency distribution."""

    name = "mig-slots"

    def __init__(
        self,
        distribution: Mapping[tuple[str, str], float],
        serve: float,
        keep: float,
        fuller: float,
    ) -> None:
        self.distribution = distribution
        self.serve = serve
        self.keep = keep
        self.fuller = fuller

    def score(self, st: NodeState, option: Placement) -> float:
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
        weights = {p: w for (m, p), w in self.distribution.items() if m == model}
        if not weights:
            weights = {option.mig_profile: 1.0}
        total = sum(weights.values())
        served = 0.0
        for profile, w in weights.items():
            existing = any(i.profile == profile and i.start in free for i in layout)
            creatable = st.node.mig_reconfigurable and any(
                True for _ in mig.free_starts(geom, profile, layout)
            )
            if existing or creatable:
                served += w
        keep = 0.0 if option.mig_created else 1.0
        left = sum(len(f) for f in st.mig_free) / max(1, sum(len(x) for x in st.mig_layout))
        return 100.0 * (self.serve * served / total + self.keep * keep + self.fuller * (1 - left))
