"""Placement quality on the Alibaba "openb" GPU trace (Weng et al., USENIX ATC 2023).

Replays the published protocol through the portal's own placement code
(``policies.placement``): ``python -m benchmarks.openb --policy all``. See
``docs/placement.md`` and ``benchmarks/results/openb.md``.
"""
