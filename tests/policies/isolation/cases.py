"""The inputs of the golden files (shared with the connectivity test)."""

from __future__ import annotations

from policies.isolation import IsolationSettings, TenantSpec

SETTINGS = IsolationSettings(
    flavors=frozenset(
        {"H100-80GB", "A100-80GB", "A100-80GB/3g.40gb", "A100-80GB/1g.10gb", "T4/share"}
    )
)

# Everything on: GPUs of two models, a MIG profile, shares, internet, a node pool.
FULL = TenantSpec(
    name="vision",
    gpu_limits={"H100-80GB": 8, "A100-80GB": 4, "A100-80GB/3g.40gb": 2, "T4/share": 2500},
    cpu_millis=64_000,
    memory_mib=262_144,
    pods=50,
    allow_intra_tenant_traffic=True,
    internet_egress=True,
    node_pool="pool-h100",
)

# CPU only, no traffic between its own pods, no internet.
LOCKED = TenantSpec(
    name="audit",
    gpu_limits={},
    cpu_millis=2_500,
    memory_mib=3_000,
    pods=4,
    allow_intra_tenant_traffic=False,
    internet_egress=False,
)
