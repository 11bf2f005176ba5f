from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from policies.errors import InvalidRequest
from policies.inventory import Taint, TaintEffect
from policies.mig import MigInstance
from policies.topology import LinkClass
from portal.inventory import simulated
from portal.inventory.events import EventKind, InventorySource

HEADER = "version: 1\nnodes:\n"


def test_demo_inventory_is_a_small_realistic_mix() -> None:
    nodes = {n.name: n for n in simulated.load_demo()}

    assert sorted(nodes) == ["a100-1", "hgx-1", "hgx-2", "t4-1", "t4-2"]
    hgx = nodes["hgx-1"]
    assert hgx.models == {"H100-80GB"} and len(hgx.gpus) == 8
    assert hgx.link_topology.worst_link(range(8)) is LinkClass.NVSWITCH
    assert hgx.link_topology.numa == (0, 0, 0, 0, 1, 1, 1, 1)
    a100 = nodes["a100-1"]
    assert [g.mig_enabled for g in a100.gpus] == [True, True, False, False]
    assert a100.gpus[0].mig_layout == (
        MigInstance("3g.40gb", 0),
        MigInstance("2g.20gb", 4),
        MigInstance("1g.10gb", 6),
    )
    assert a100.link_topology.link(2, 3) is LinkClass.NVLINK
    assert a100.link_topology.link(1, 2) is LinkClass.CROSS_SOCKET
    t4 = nodes["t4-2"]
    assert all(g.shareable for g in t4.gpus)
    assert t4.labels == {"node.kubernetes.io/instance-type": "t4-2"}
    assert {n.rack for n in nodes.values()} == {"r1", "r2"}


def test_overrides_count_labels_taints_and_mig_all() -> None:
    nodes = simulated.loads(
        HEADER
        + """
  - name: box
    preset: a100-pcie-4-nvlink-pairs
    count: 3
    rack: r9
    zone: z
    clique: c1
    pool: research
    labels: {team: vision, spot: true}
    taints: ["gpu=true:NoSchedule", {key: maint, effect: NoExecute}]
    schedulable: false
    cpu: "64"
    memory: 256Gi
    mig:
      all: ["7g.80gb@0"]
      2: []
""",
        source="x.yaml",
    )

    assert [n.name for n in nodes] == ["box-1", "box-2", "box-3"]
    n = nodes[2]
    assert (n.rack, n.zone, n.clique, n.pool, n.schedulable) == ("r9", "z", "c1", "research", False)
    assert n.labels == {"team": "vision", "spot": "true"}
    assert n.taints == (
        Taint("gpu", "true", TaintEffect.NO_SCHEDULE),
        Taint("maint", "", TaintEffect.NO_EXECUTE),
    )
    assert (n.cpu_milli, n.memory_mib) == (64_000, 262_144)
    assert [g.mig_layout for g in n.gpus] == [
        (MigInstance("7g.80gb", 0),),
        (MigInstance("7g.80gb", 0),),
        (),
        (MigInstance("7g.80gb", 0),),
    ]
    assert all(g.mig_enabled for g in n.gpus)


def test_shareable_applies_to_gpus_without_mig() -> None:
    (n,) = simulated.loads(
        HEADER + "  - {name: a, preset: a100-pcie-4-nvlink-pairs, shareable: true, "
        "mig: {0: ['1g.10gb@0']}}\n"
    )
    assert [g.shareable for g in n.gpus] == [False, True, True, True]


def test_generate_stamps_many_nodes_into_racks() -> None:
    nodes = simulated.generate({"hgx-h100-8": 1250, "t4-2": 3}, nodes_per_rack=4)

    assert len(nodes) == 1253
    assert nodes[0].name == "hgx-h100-8-1" and nodes[0].rack == "r1"
    assert nodes[4].rack == "r2"
    assert nodes[-1].name == "t4-2-3" and nodes[-1].rack == "r314"
    assert sum(len(n.gpus) for n in nodes) == 10_006


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "version: 1\nnodes: [\n",
            "invalid bad.yaml YAML (expected the node content, but found '<stream end>' at "
            "line 3, column 1): expected valid YAML",
        ),
        ("nodes: []\n", "invalid bad.yaml: version None: expected 1"),
        ("version: 2\nnodes: []\n", "invalid bad.yaml: version 2: expected 1"),
        ("version: 1\nnodes: []\n", "invalid bad.yaml: nodes []: expected a non-empty list"),
        (
            HEADER + "  - {name: a, preset: dgx-9000}\n",
            "invalid bad.yaml: nodes[0] (a) preset 'dgx-9000': expected one of "
            "a100-pcie-4-nvlink-pairs, hgx-h100-8, pcie-2socket-8, t4-2",
        ),
        (
            HEADER + "  - {name: a, preset: t4-2, gpus: 3}\n",
            "invalid bad.yaml: nodes[0] (a) key 'gpus': expected one of clique, count, cpu,",
        ),
        (
            HEADER + "  - {name: a, preset: a100-pcie-4-nvlink-pairs, mig: {0: ['3g.40gb@2']}}\n",
            "invalid bad.yaml: nodes[0] (a) mig: MIG placement 3g.40gb@2 on A100-80GB: "
            "expected a start slot in [0, 4]",
        ),
        (
            HEADER + "  - {name: a, preset: a100-pcie-4-nvlink-pairs, mig: {0: ['3g.40gb']}}\n",
            "invalid bad.yaml: nodes[0] (a) mig[0] '3g.40gb': expected 'profile@start'",
        ),
        (
            HEADER + "  - {name: a, preset: a100-pcie-4-nvlink-pairs, mig: {7: []}}\n",
            "invalid bad.yaml: nodes[0] (a) mig key 7: expected a GPU index 0..3 or 'all'",
        ),
        (
            HEADER + "  - {name: a, preset: t4-2, mig: {0: ['1g.5gb@0']}}\n",
            "invalid bad.yaml: nodes[0] (a) mig: MIG-capable model T4: expected one of",
        ),
        (
            HEADER + "  - {name: a, preset: t4-2, memory: 12 GB}\n",
            "invalid bad.yaml: nodes[0] (a) memory '12 GB': expected a Kubernetes quantity",
        ),
        (
            HEADER + "  - {name: Bad_Name, preset: t4-2}\n",
            "invalid bad.yaml: nodes[0] (Bad_Name) node name 'Bad_Name': expected a DNS-1123",
        ),
        (
            HEADER + "  - {name: a, preset: t4-2}\n  - {name: a, preset: t4-2}\n",
            "invalid bad.yaml: nodes[1] (a) name 'a': expected a name not already used by "
            "bad.yaml: nodes[0] (a)",
        ),
        (
            HEADER + "  - {name: a, preset: t4-2, taints: ['x:Sometimes']}\n",
            "invalid bad.yaml: nodes[0] (a) taints effect 'Sometimes': expected one of NoSchedule",
        ),
        (
            HEADER + "  - {name: a, template: nope}\n",
            "invalid bad.yaml: nodes[0] (a) template 'nope': expected one of none",
        ),
        (
            HEADER + "  - {name: a, preset: t4-2, count: 0}\n",
            "invalid bad.yaml: nodes[0] (a) count 0: expected an integer >= 1",
        ),
    ],
)
def test_errors_name_file_node_field_value_and_what_is_valid(text: str, message: str) -> None:
    with pytest.raises(InvalidRequest) as info:
        simulated.loads(text, source="bad.yaml")
    assert info.value.message.startswith(message), info.value.message


def test_load_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(HEADER + "  - {name: a, preset: nope}\n")
    with pytest.raises(InvalidRequest, match=r"^invalid inv\.yaml: nodes\[0\] \(a\) preset"):
        simulated.load(path)
    with pytest.raises(InvalidRequest, match="expected a readable YAML file"):
        simulated.load(tmp_path / "missing.yaml")


async def test_file_source_yields_the_differences_when_the_file_changes(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(HEADER + "  - {name: a, preset: t4-2}\n  - {name: b, preset: t4-2}\n")
    source = simulated.SimulatedInventory.from_file(path, poll_s=0.01)
    assert isinstance(source, InventorySource)
    assert [n.name for n in source.snapshot()] == ["a", "b"]
    events = source.watch()

    # A broken file is ignored (the previous inventory stays), the next good one applies.
    path.write_text(HEADER + "  - {name: a, preset: nope}\n")
    os.utime(path, ns=(1, 1))
    await asyncio.sleep(0.05)
    path.write_text(HEADER + "  - {name: a, preset: t4-2, rack: r2}\n  - {name: c, preset: t4-2}\n")
    os.utime(path, ns=(2, 2))
    got = [await asyncio.wait_for(anext(events), 5) for _ in range(3)]

    assert [(e.kind, e.name) for e in got] == [
        (EventKind.REMOVED, "b"),
        (EventKind.UPDATED, "a"),
        (EventKind.ADDED, "c"),
    ]
    assert sorted(n.name for n in source.snapshot()) == ["a", "c"]
    await events.aclose()


async def test_fixed_source_yields_nothing() -> None:
    source = simulated.SimulatedInventory.demo()
    assert [e async for e in source.watch()] == []
    assert len(source.snapshot()) == 5
