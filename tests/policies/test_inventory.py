"""Inventory values: node names, GPU indices, MIG layouts, topology size — bad input refused."""

from __future__ import annotations

from typing import Any

import pytest

from policies.errors import InvalidRequest
from policies.inventory import GPU, Node
from policies.mig import MigInstance
from policies.topology import LinkClass, Topology

H100_MIB = 80 * 1024


def h100(i: int, **fields: Any) -> GPU:
    return GPU(index=i, model="H100-80GB", memory_mib=H100_MIB, **fields)


def node(name: str = "gpu-1", gpus: int = 2, **fields: Any) -> Node:
    return Node(name, tuple(h100(i) for i in range(gpus)), 64_000, 512_000, **fields)


@pytest.mark.parametrize(
    "name",
    ["a", "gpu-1", "gpu-1.rack-2.example", "0", "a" * 253],
)
def test_dns_1123_node_names_are_accepted(name: str) -> None:
    assert node(name).name == name


@pytest.mark.parametrize(
    "name",
    [
        "",
        "GPU-1",  # uppercase
        "gpu_1",  # underscore
        "-gpu",  # must start alphanumeric
        "gpu-",  # must end alphanumeric
        "gpu.",
        "gpü-1",  # non-ASCII letter
        "gpu-1\n",  # a trailing newline must not slip through
        "gpu 1",
        "a" * 254,  # one over the DNS-1123 subdomain limit
    ],
)
def test_a_bad_node_name_is_refused_saying_what_is_valid(name: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        node(name)
    assert "DNS-1123" in err.value.message


@pytest.mark.parametrize(
    ("indices", "shown"),
    [((1, 0), "[1, 0]"), ((0, 2), "[0, 2]"), ((0, 0), "[0, 0]"), ((1,), "[1]")],
)
def test_gpu_indices_must_be_0_to_n_in_order(indices: tuple[int, ...], shown: str) -> None:
    with pytest.raises(InvalidRequest) as err:
        Node("n", tuple(h100(i) for i in indices), 1000, 1000)
    assert shown in err.value.message and "in order" in err.value.message


@pytest.mark.parametrize(
    ("fields", "in_message"),
    [
        ({"index": -1}, "GPU index -1"),
        ({"memory_mib": 0}, "positive number of MiB"),
        ({"mig_enabled": True, "shareable": True}, "not both"),
        ({"mig_layout": (MigInstance("1g.10gb", 0),)}, "unless MIG is enabled"),
        # 4g@0 holds slices 0-3; 2g@2 overlaps it.
        (
            {
                "mig_enabled": True,
                "mig_layout": (MigInstance("4g.40gb", 0), MigInstance("2g.20gb", 2)),
            },
            "2g.20gb@2",
        ),
        ({"mig_enabled": True, "mig_layout": (MigInstance("3g.20gb", 0),)}, "3g.40gb"),
    ],
)
def test_a_bad_gpu_is_refused(fields: dict[str, Any], in_message: str) -> None:
    base = {"index": 0, "model": "H100-80GB", "memory_mib": H100_MIB}
    with pytest.raises(InvalidRequest) as err:
        GPU(**{**base, **fields})
    assert in_message in err.value.message


def test_mig_on_a_model_without_mig_lists_the_mig_capable_models() -> None:
    with pytest.raises(InvalidRequest) as err:
        GPU(0, "T4", 16 * 1024, mig_enabled=True)
    assert "T4" in err.value.message and "H100-80GB" in err.value.message


def test_negative_node_capacity_is_refused() -> None:
    with pytest.raises(InvalidRequest):
        Node("n", (), -1, 0)
    with pytest.raises(InvalidRequest):
        Node("n", (), 0, -1)


def test_the_topology_must_cover_every_gpu() -> None:
    with pytest.raises(InvalidRequest) as err:
        node(gpus=2, topology=Topology.from_numa([0, 0, 1]))
    assert "3 GPUs" in err.value.message and "2 GPUs on gpu-1" in err.value.message


def test_without_a_topology_the_gpus_count_as_one_numa_node() -> None:
    n = node(gpus=4)
    assert n.link_topology.worst_link((0, 1, 2, 3)) is LinkClass.SAME_NUMA
    declared = Topology.uniform(4, LinkClass.NVSWITCH)
    assert node(gpus=4, topology=declared).link_topology is declared


def test_models_are_the_distinct_gpu_models() -> None:
    gpus = (h100(0), GPU(1, "A30-24GB", 24 * 1024), h100(2))
    assert Node("mixed", gpus, 1, 1).models == frozenset({"H100-80GB", "A30-24GB"})
    assert Node("cpu", (), 1, 1).models == frozenset()
