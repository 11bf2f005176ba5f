"""ClusterFork: a decision's copy-on-write working copy of the cluster state.

The root never changes through a fork, a fork sees its own changes, and placement's cached
score indexes stay right whichever of root and forks they were last used on (a fork that is
dropped, as when a commit fails, must leave nothing stale behind).
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from policies.flavors import FlavorKind
from policies.inventory import GPU, Node
from policies.placement.fork import ClusterFork
from policies.placement.pipeline import ANYWHERE, NoFit, _scan, place
from policies.placement.scorers import policy as named_policy
from policies.placement.state import ClusterState, Placement
from policies.requests import DeviceRequest
from policies.topology import LinkClass, Topology


def node(name: str, gpus: int = 4) -> Node:
    return Node(
        name,
        tuple(GPU(i, "T4", 15360, uuid=f"{name}-{i}", shareable=True) for i in range(gpus)),
        cpu_milli=64_000,
        memory_mib=262_144,
        topology=Topology.uniform(gpus, LinkClass.SAME_PCIE_SWITCH),
    )


def free(cluster: ClusterState) -> dict[str, tuple[int, ...]]:
    return {st.name: tuple(st.free_milli) for st in cluster}


WHOLE = DeviceRequest(FlavorKind.GPU, count=1, models=frozenset({"T4"}))
SHARES = [DeviceRequest(FlavorKind.SHARE, milli=m, models=frozenset({"T4"})) for m in (250, 500)]


def test_a_fork_sees_its_changes_and_the_root_does_not() -> None:
    root = ClusterState([node("a"), node("b")])
    before, seq = free(root), root.seq
    fork = ClusterFork(root)
    fork.apply(Placement("a", (0,), milli=1000))
    fork.remove_node("b")
    fork.add_node(node("c", 2))
    assert free(fork) == {"a": (0, 1000, 1000, 1000), "c": (1000, 1000)}
    assert sorted(st.name for st in fork.candidates(frozenset({"T4"}))) == ["a", "c"]
    assert fork.touched == {"a", "b", "c"}
    assert free(root) == before and root.seq == seq
    assert root.node("a").free_milli == [1000, 1000, 1000, 1000]


def test_a_dropped_fork_leaves_the_root_index_right() -> None:
    policy = named_policy("gpuportal")
    root = ClusterState([node("a"), node("b")])
    first = place(WHOLE, root, policy)
    assert isinstance(first, Placement)
    fork = ClusterFork(root)
    for _ in range(4):  # fill node a on the fork: the fork's index entries now say "b"
        got = place(WHOLE, fork, policy)
        assert isinstance(got, Placement)
        fork.apply(got)
    # The fork is dropped (its commit failed): the root must answer as before.
    assert place(WHOLE, root, policy) == first == _scan(WHOLE, root, policy, ANYWHERE)


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["fork-place", "commit", "drop", "root-place"]), st.integers(0, 2)
        ),
        min_size=1,
        max_size=30,
    )
)
def test_the_cached_index_answers_what_a_full_scan_answers(steps: list[tuple[str, int]]) -> None:
    policy = named_policy("gpuportal")
    root = ClusterState([node("a"), node("b", 2), node("c", 8)])
    fork = ClusterFork(root)
    pending: list[Placement] = []
    for action, which in steps:
        req = [WHOLE, *SHARES][which]
        if action == "drop":
            fork, pending = ClusterFork(root), []
            continue
        if action == "commit":
            for p in pending:  # the decision applied to the live state, as State.apply does
                root.apply(p)
            fork, pending = ClusterFork(root), []
            continue
        target = fork if action == "fork-place" else root
        got = place(req, target, policy)
        want = _scan(req, target, policy, ANYWHERE)
        assert got == want or (isinstance(got, NoFit) and isinstance(want, NoFit))
        if action == "fork-place" and isinstance(got, Placement):
            fork.apply(got)
            pending.append(got)
        if action == "root-place" and isinstance(got, Placement):
            root.apply(got)  # another decision was applied: older forks are stale
            fork, pending = ClusterFork(root), []


def test_a_settled_fork_keeps_only_its_own_copies_and_reads_the_same() -> None:
    """Group commit: a fork of a fork inherits the parent's copies; once the parent's changes
    are in the root, ``settle`` drops those copies and the child reads exactly as before,
    and the cached index still answers what a full scan answers."""
    policy = named_policy("gpuportal")
    root = ClusterState([node("a"), node("b"), node("c", 2)])
    parent = ClusterFork(root)
    parent.apply(Placement("a", (0,), milli=1000))
    parent.remove_node("c")
    child = parent.fork()
    child.apply(Placement("b", (1,), milli=500))
    assert place(WHOLE, child, policy) == _scan(WHOLE, child, policy, ANYWHERE)
    before = free(child)
    root.apply(Placement("a", (0,), milli=1000))  # the parent's decision is applied
    root.remove_node("c")
    child.settle(len(parent.fork_log))
    assert free(child) == before
    assert child.touched == {"b"}
    assert set(child.candidates(frozenset({"T4"}))) == {root.node("a"), child.node("b")}
    assert child.node("a") is root.node("a")  # the inherited copy is gone
    assert place(WHOLE, child, policy) == _scan(WHOLE, child, policy, ANYWHERE)
    child.settle(0)  # nothing applied: nothing changes
    assert free(child) == before
