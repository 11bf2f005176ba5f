"""ClusterState: apply/unapply round trips, and refused changes that leave no trace."""

from __future__ import annotations

from typing import Any

import pytest

from policies.errors import Conflict, InvalidRequest, NotFound
from policies.inventory import GPU, Node
from policies.mig import MigInstance
from policies.placement.state import ClusterState, NodeState, Placement

MIB = 80 * 1024


def whole_node(name: str = "w", gpus: int = 4, *, shareable: bool = False) -> Node:
    return Node(
        name,
        tuple(GPU(i, "H100-80GB", MIB, shareable=shareable) for i in range(gpus)),
        cpu_milli=32_000,
        memory_mib=256_000,
    )


def mig_node(name: str = "m", *, reconfigurable: bool = False) -> Node:
    # GPU 0: 4g@0 + 3g@4 exist; GPU 1: MIG-enabled and empty.
    layout = (MigInstance("4g.40gb", 0), MigInstance("3g.40gb", 4))
    gpus = (
        GPU(0, "H100-80GB", MIB, mig_enabled=True, mig_layout=layout),
        GPU(1, "H100-80GB", MIB, mig_enabled=True),
    )
    return Node(name, gpus, 16_000, 128_000, mig_reconfigurable=reconfigurable)


def snapshot(st: NodeState) -> dict[str, Any]:
    """Every free-capacity field of a node (``version`` only counts changes)."""
    return {
        "cpu_free": st.cpu_free,
        "mem_free": st.mem_free,
        "free_milli": list(st.free_milli),
        "free_mem": list(st.free_mem),
        "mig_layout": [sorted((i.profile, i.start) for i in lay) for lay in st.mig_layout],
        "mig_free": [sorted(f) for f in st.mig_free],
        "full_free": st.full_free,
        "max_free_milli": st.max_free_milli,
        "free_milli_total": st.free_milli_total,
        "schedulable": st.schedulable,
    }


def cluster_snapshot(c: ClusterState) -> dict[str, dict[str, Any]]:
    return {name: snapshot(st) for name, st in c.nodes.items()}


ROUND_TRIPS = [
    # two whole GPUs plus host resources
    Placement("w", gpus=(1, 3), milli=1000, cpu_milli=4000, memory_mib=10_000),
    # a share: 300 milli and 8 GiB of GPU 2
    Placement("s", gpus=(2,), milli=300, gpu_memory_mib=8192, cpu_milli=500),
    # an existing MIG instance
    Placement("m", gpus=(0,), mig_profile="3g.40gb", mig_start=4, cpu_milli=1000),
    # a MIG instance created on the empty MIG GPU
    Placement("r", gpus=(1,), mig_profile="2g.20gb", mig_start=2, mig_created=True),
    # CPU only
    Placement("w", cpu_milli=32_000, memory_mib=256_000),
]


def cluster() -> ClusterState:
    return ClusterState(
        [
            whole_node("w"),
            whole_node("s", shareable=True),
            mig_node("m"),
            mig_node("r", reconfigurable=True),
        ]
    )


@pytest.mark.parametrize("p", ROUND_TRIPS, ids=lambda p: f"{p.node}{p.gpus}")
def test_apply_then_unapply_restores_the_exact_free_state(p: Placement) -> None:
    c = cluster()
    before = cluster_snapshot(c)
    c.apply(p)
    assert cluster_snapshot(c) != before
    c.unapply(p)
    assert cluster_snapshot(c) == before


def test_apply_takes_exactly_what_the_placement_names() -> None:
    c = cluster()
    c.apply(ROUND_TRIPS[0])
    w = c.node("w")
    # GPUs 1 and 3 of 4 taken: 0 and 2 stay whole-free; 32000-4000 CPU left.
    assert w.free_gpus() == [0, 2] and w.full_free == 2
    assert w.free_milli_total == 2000 and w.cpu_free == 28_000 and w.mem_free == 246_000
    c.apply(ROUND_TRIPS[1])
    s = c.node("s")
    assert s.free_milli[2] == 700 and s.free_mem[2] == MIB - 8192
    assert s.max_free_milli == 1000  # other shareable GPUs are untouched
    assert s.full_free == 3


OVERCOMMITS = [
    # 33000m CPU on a 32000m node
    Placement("w", gpus=(0,), milli=1000, cpu_milli=33_000),
    Placement("w", memory_mib=256_001),
    # GPU 4 does not exist on a 4-GPU node
    Placement("w", gpus=(0, 4), milli=1000),
    # share asks more GPU memory than the GPU has
    Placement("s", gpus=(0,), milli=100, gpu_memory_mib=MIB + 1),
    # the 4g.40gb instance exists at 0, not a 3g
    Placement("m", gpus=(0,), mig_profile="3g.40gb", mig_start=0),
    # no instance at all on GPU 1 of a non-reconfigurable node
    Placement("m", gpus=(1,), mig_profile="1g.10gb", mig_start=0),
    # creating 4g@0 next to nothing is fine, but 2g@1 is not a documented start
    Placement("r", gpus=(1,), mig_profile="2g.20gb", mig_start=1, mig_created=True),
    # creating on GPU 0 whose slices 0-7 are all held by existing instances
    Placement("r", gpus=(0,), mig_profile="1g.10gb", mig_start=0, mig_created=True),
    # a MIG instance on a GPU that is not MIG-enabled would double-book a whole GPU
    Placement("w", gpus=(0,), mig_profile="1g.10gb", mig_start=0, mig_created=True),
    # whole GPU of a MIG-enabled GPU
    Placement("m", gpus=(1,), milli=1000),
]


@pytest.mark.parametrize("p", OVERCOMMITS, ids=lambda p: f"{p.node}{p.gpus}{p.mig_profile}")
def test_an_over_committing_apply_is_refused_and_changes_nothing(p: Placement) -> None:
    c = cluster()
    # Some capacity already taken so the refused apply meets a non-trivial state.
    c.apply(ROUND_TRIPS[1])
    before = cluster_snapshot(c)
    with pytest.raises((Conflict, InvalidRequest)):
        c.apply(p)
    assert cluster_snapshot(c) == before


def test_a_gpu_taken_twice_is_a_conflict() -> None:
    c = cluster()
    c.apply(Placement("w", gpus=(2,), milli=1000))
    before = cluster_snapshot(c)
    with pytest.raises(Conflict) as err:
        c.apply(Placement("w", gpus=(1, 2), milli=1000))
    assert "GPU 2 on w" in err.value.message
    assert cluster_snapshot(c) == before


def test_duplicate_gpu_indices_are_refused() -> None:
    c = cluster()
    before = cluster_snapshot(c)
    with pytest.raises(InvalidRequest) as err:
        c.apply(Placement("w", gpus=(1, 1), milli=1000))
    assert "distinct" in err.value.message
    assert cluster_snapshot(c) == before


def test_shares_fill_a_gpu_exactly_and_no_further() -> None:
    c = cluster()
    # 400 + 600 = 1000 milli: exactly full; one more milli is over.
    c.apply(Placement("s", gpus=(0,), milli=400, gpu_memory_mib=1024))
    c.apply(Placement("s", gpus=(0,), milli=600, gpu_memory_mib=1024))
    assert c.node("s").free_milli[0] == 0
    with pytest.raises(Conflict):
        c.apply(Placement("s", gpus=(0,), milli=1))


@pytest.mark.parametrize(
    "p",
    [
        Placement("w", gpus=(0,), milli=1000),  # GPU 0 is already free
        Placement("w", gpus=(0,), milli=1000, cpu_milli=1),
        Placement("s", gpus=(1,), milli=300, gpu_memory_mib=8192),
        Placement("m", gpus=(0,), mig_profile="3g.40gb", mig_start=4),  # not taken
        Placement("r", gpus=(1,), mig_profile="2g.20gb", mig_start=2, mig_created=True),
    ],
    ids=lambda p: f"{p.node}{p.gpus}{p.mig_profile}",
)
def test_unapply_of_something_never_applied_is_refused_and_changes_nothing(p: Placement) -> None:
    c = cluster()
    before = cluster_snapshot(c)
    with pytest.raises(Conflict):
        c.unapply(p)
    assert cluster_snapshot(c) == before


def test_the_model_index_follows_node_add_and_remove() -> None:
    c = ClusterState([whole_node("a"), whole_node("b")])
    a30 = Node("c", (GPU(0, "A30-24GB", 24 * 1024),), 1000, 1000)
    c.add_node(a30)
    assert {s.name for s in c.candidates(frozenset({"H100-80GB"}))} == {"a", "b"}
    assert {s.name for s in c.candidates(frozenset())} == {"a", "b", "c"}
    c.remove_node("a")
    assert {s.name for s in c.candidates(frozenset({"H100-80GB"}))} == {"b"}
    with pytest.raises(NotFound):
        c.node("a")
    with pytest.raises(Conflict):
        c.add_node(whole_node("b"))


def test_a_node_with_two_models_is_one_candidate_for_both() -> None:
    mixed = Node("mixed", (GPU(0, "H100-80GB", MIB), GPU(1, "A30-24GB", 24 * 1024)), 1000, 1000)
    c = ClusterState([mixed])
    names = [s.name for s in c.candidates(frozenset({"H100-80GB", "A30-24GB"}))]
    assert names == ["mixed"]


def test_node_order_is_insertion_order_unless_given() -> None:
    c = ClusterState([whole_node("a"), whole_node("b")])
    assert [c.node(n).order for n in ("a", "b")] == [0, 1]
    c.add_node(whole_node("z"), order=10)
    c.add_node(whole_node("y"))
    assert c.node("y").order == 11
