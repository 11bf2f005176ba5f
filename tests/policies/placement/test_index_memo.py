"""The score index's memo of answers per node signature gives what scoring each node would.

Nodes of one kind in the same free state share one answer (but for the node's name); these
tests run random places, releases and learning over twin nodes (equal hardware, different
names, UUIDs and racks) and compare every indexed answer with a full scan, which never
uses the memo.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.mig import MigInstance
from policies.placement import pipeline
from policies.placement.framework import PlacementContext
from policies.placement.pipeline import ANYWHERE, _scan, place
from policies.placement.scorers import policy as named_policy
from policies.placement.scorers.fragmentation import Shape
from policies.placement.state import ClusterState, NodeState, Placement
from policies.requests import DeviceRequest, TopologyRequirement
from policies.topology import LinkClass, Topology

H100 = 80 * 1024


def h100(name: str, rack: str, cpu: int = 128_000) -> Node:
    numa = (0, 0, 0, 0, 1, 1, 1, 1)
    return Node(
        name,
        tuple(GPU(i, "H100-80GB", H100, uuid=f"{name}-{i}") for i in range(8)),
        cpu,
        1_024_000,
        topology=Topology.uniform(8, LinkClass.NVSWITCH, numa),
        rack=rack,
    )


def t4(name: str, rack: str) -> Node:
    gpus = tuple(GPU(i, "T4", 16_384, uuid=f"{name}-{i}", shareable=True) for i in range(4))
    return Node(name, gpus, 32_000, 256_000, rack=rack)


def a100_mig(name: str, rack: str) -> Node:
    layout = (MigInstance("3g.40gb", 0, uuid=f"{name}-m0"), MigInstance("3g.40gb", 4))
    gpus = (
        GPU(0, "A100-80GB", H100, uuid=f"{name}-0", mig_enabled=True, mig_layout=layout),
        GPU(1, "A100-80GB", H100, uuid=f"{name}-1", mig_enabled=True),
    )
    return Node(name, gpus, 32_000, 256_000, rack=rack, mig_reconfigurable=True)


def cluster_nodes() -> list[Node]:
    nodes: list[Node] = []
    for i in range(6):
        rack = f"r{i % 2}"
        nodes += [h100(f"h{i}", rack), t4(f"t{i}", rack), a100_mig(f"a{i}", rack)]
    nodes.append(h100("h-small", "r0", cpu=40_000))  # same GPUs, less CPU: another kind
    return nodes


def whole(n: int) -> DeviceRequest:
    topology = TopologyRequirement.NVLINK if n > 1 else TopologyRequirement.ANY
    return DeviceRequest(
        FlavorKind.GPU,
        count=n,
        models=frozenset({"H100-80GB"}),
        cpu_milli=8000 * n,
        memory_mib=65_536 * n,
        topology=topology,
    )


REQUESTS = [
    whole(1),
    whole(2),
    whole(4),
    whole(8),
    DeviceRequest(FlavorKind.SHARE, milli=250, gpu_memory_mib=4096, models=frozenset({"T4"})),
    DeviceRequest(FlavorKind.SHARE, milli=500, gpu_memory_mib=4096, models=frozenset({"T4"})),
    DeviceRequest(FlavorKind.MIG, mig_profile="3g.40gb", models=frozenset({"A100-80GB"})),
    DeviceRequest(FlavorKind.MIG, mig_profile="1g.10gb", models=frozenset({"A100-80GB"})),
    DeviceRequest(cpu_milli=2000, memory_mib=4096),
]


def test_twins_share_a_kind_and_a_signature_until_their_states_differ() -> None:
    a, b = NodeState(h100("x", "r0"), 0), NodeState(h100("y", "r1"), 1)
    assert a.hardware == b.hardware and a.signature() == b.signature()
    assert NodeState(h100("z", "r0", cpu=40_000), 2).hardware != a.hardware
    a._take(Placement("x", (0,), milli=1000, cpu_milli=8000))
    assert a.signature() != b.signature()
    b._take(Placement("y", (0,), milli=1000, cpu_milli=8000))
    assert a.signature() == b.signature()
    m, n = NodeState(a100_mig("m", "r0"), 3), NodeState(a100_mig("n", "r0"), 4)
    assert m.signature() == n.signature()  # instance UUIDs are not read by any score
    m._take(Placement("m", (0,), mig_profile="3g.40gb", mig_start=4))
    assert m.signature() != n.signature()


@pytest.mark.parametrize("name", ["gpuportal", "binpack", "bestfit", "fgd"])
def test_the_memoized_index_answers_what_a_full_scan_answers(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    typical = [(Shape(8_000, 1000, 1), 0.5), (Shape(2_000, 250, 1), 0.5)]
    options = {"typical": typical} if name == "fgd" else {}
    pol = named_policy(name, **options)
    # Nodes the index re-read, and how many of those it had to score (the rest: the memo).
    counts = {"reread": 0, "scored": 0}
    rescore, best_on_node = pipeline._rescore, type(pol).best_on_node

    def reread(idx: Any, req: DeviceRequest, st: NodeState, *rest: Any) -> None:
        counts["reread"] += 1
        rescore(idx, req, st, *rest)

    def scoring(self: Any, req: DeviceRequest, st: NodeState, cluster: ClusterState) -> Any:
        counts["scored"] += 1
        return best_on_node(self, req, st, cluster)

    monkeypatch.setattr(pipeline, "_rescore", reread)
    monkeypatch.setattr(type(pol), "best_on_node", scoring)
    rng = random.Random(f"memo-{name}")
    cluster = ClusterState(cluster_nodes())
    held: list[Placement] = []
    placed = asked = index_scored = 0
    for _ in range(400):
        if held and rng.random() < 0.4:
            cluster.unapply(held.pop(rng.randrange(len(held))))
            continue
        req = rng.choice(REQUESTS)
        avoid = PlacementContext(avoid=frozenset({rng.choice(list(cluster.nodes))}))
        scored = counts["scored"]
        got = place(req, cluster, pol, avoid)
        index_scored += counts["scored"] - scored
        assert got == _scan(req, cluster, pol, avoid)
        scored = counts["scored"]
        got = place(req, cluster, pol)
        index_scored += counts["scored"] - scored
        assert got == _scan(req, cluster, pol, ANYWHERE)
        asked += 1
        if isinstance(got, Placement):
            cluster.apply(got)
            held.append(got)
            placed += 1
        pol.observe(req, got if isinstance(got, Placement) else None)
    assert placed > 100 and asked > 200
    # The memo answered for most nodes the index re-read (else this test would not
    # exercise it): twins and states seen before.
    assert 0 < index_scored < counts["reread"] / 2
