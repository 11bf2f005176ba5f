"""Topology: link classes ordered best-last, matrix validation, weakest link of a set."""

from __future__ import annotations

import pytest

from policies.errors import InvalidRequest
from policies.topology import LinkClass, Topology

L = LinkClass


def test_link_classes_order_from_cross_socket_to_nvswitch() -> None:
    # nvidia-smi topo -m, worst to best: SYS < NODE < PHB < PIX/PXB < NV# < NVSwitch.
    assert sorted(LinkClass) == [
        L.CROSS_SOCKET,
        L.SAME_NUMA,
        L.SAME_HOST_BRIDGE,
        L.SAME_PCIE_SWITCH,
        L.NVLINK,
        L.NVSWITCH,
    ]
    assert L.NVLINK.label == "NVLink" and L.CROSS_SOCKET.label == "cross-socket"


@pytest.mark.parametrize(
    ("text", "link"),
    [("nvlink", L.NVLINK), ("NVSWITCH", L.NVSWITCH), ("same-pcie-switch", L.SAME_PCIE_SWITCH)],
)
def test_a_link_class_parses_from_its_name(text: str, link: LinkClass) -> None:
    assert LinkClass.parse(text) is link


def test_an_unknown_link_class_lists_the_known_ones() -> None:
    with pytest.raises(InvalidRequest) as err:
        LinkClass.parse("infiniband")
    assert "infiniband" in err.value.message and "nvlink" in err.value.message


def test_an_asymmetric_matrix_is_refused_naming_the_pair() -> None:
    links = ((L.NVLINK, L.NVLINK), (L.CROSS_SOCKET, L.NVLINK))
    with pytest.raises(InvalidRequest) as err:
        Topology(links=links, numa=(0, 0))
    assert "links[0][1] != links[1][0]" in err.value.message


@pytest.mark.parametrize(
    "links",
    [
        ((L.NVLINK, L.NVLINK),),  # one row for two GPUs
        ((L.NVLINK,), (L.NVLINK,)),  # rows too short
        ((L.NVLINK, L.NVLINK, L.NVLINK),) * 3,  # three GPUs' matrix, two NUMA entries
    ],
)
def test_a_matrix_of_the_wrong_size_is_refused(links: tuple[tuple[LinkClass, ...], ...]) -> None:
    with pytest.raises(InvalidRequest) as err:
        Topology(links=links, numa=(0, 0))
    assert "2x2" in err.value.message


def test_nvlink_lane_counts_must_match_the_matrix() -> None:
    links = ((L.NVLINK, L.NVLINK), (L.NVLINK, L.NVLINK))
    Topology(links=links, numa=(0, 0), nvlink_lanes=((0, 12), (12, 0)))
    with pytest.raises(InvalidRequest):
        Topology(links=links, numa=(0, 0), nvlink_lanes=((0, 12),))
    with pytest.raises(InvalidRequest):
        Topology(links=links, numa=(0, 0), nvlink_lanes=((0, 12), (4, 0)))


def test_from_numa_joins_same_socket_gpus_by_numa_and_others_cross_socket() -> None:
    topo = Topology.from_numa([0, 0, 1, 1])
    assert topo.size == 4
    assert topo.link(0, 1) is L.SAME_NUMA
    assert topo.link(1, 2) is L.CROSS_SOCKET
    assert topo.link(3, 2) is L.SAME_NUMA


@pytest.mark.parametrize(
    ("gpus", "worst"),
    [
        ((2,), L.NVSWITCH),  # one GPU: nothing to be weak
        ((0, 1), L.SAME_NUMA),
        ((0, 1, 2), L.CROSS_SOCKET),  # 0-2 and 1-2 cross the socket
        ((2, 3), L.SAME_NUMA),
    ],
)
def test_worst_link_is_the_weakest_pair_in_the_set(gpus: tuple[int, ...], worst: LinkClass) -> None:
    assert Topology.from_numa([0, 0, 1, 1]).worst_link(gpus) is worst


def test_uniform_builds_an_all_pairs_matrix() -> None:
    topo = Topology.uniform(8, L.NVSWITCH)
    assert topo.worst_link(tuple(range(8))) is L.NVSWITCH
    assert topo.numa == (0,) * 8
