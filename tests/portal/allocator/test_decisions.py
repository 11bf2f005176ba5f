"""Deciders are pure: they read the live state and never write it, and the same state, input
and time give the same decision. ``State.apply`` is the only writer of memory."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from types import MappingProxyType

import pytest

from policies.errors import Conflict
from policies.placement.state import ClusterState
from portal.allocator import Allocator, cycle, node_events
from portal.allocator.draft import Decision, Draft
from portal.allocator.state import State, released_this_month, snapshot
from portal.store.records import WorkloadState
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, gpus, hgx, share, wl
from tests.portal.allocator.test_properties import H100, inventory


@pytest.fixture
def busy(tmp_path: Path, clock: ManualClock) -> Iterator[Allocator]:
    """An allocator with running, queued and preempting work on a small mixed cluster."""
    store = Store(f"sqlite:///{tmp_path}/portal.sqlite")
    alloc = Allocator(store, clock=clock)
    alloc.start(inventory())
    alloc.set_tenant("t0", cohort="c")
    alloc.set_tenant("t1", cohort="c")
    for t in ("t0", "t1"):
        alloc.set_quota(t, H100, guaranteed=4, limit=8, budget_gpu_hours=50.0)
        alloc.set_quota(t, "T4/share", guaranteed=500, limit=2000)
    for i in range(3):
        alloc.request(wl("t0", gpus(2, H100), name=f"big{i}"), expected_duration_s=600)
    alloc.request(wl("t1", share(500), name="s"))
    clock.advance(seconds=30)
    alloc.request(wl("t1", gpus(4, H100), name="claim", priority=10))
    alloc.request(wl("t1", gpus(4, H100), name="waits"))
    yield alloc
    store.close()


def _freeze(state: State) -> None:
    """Make every container of the live state read-only, and the cluster refuse changes."""
    for name in ("nodes", "tenants", "quotas", "live", "preempting_amount", "history", "period"):
        setattr(state, name, MappingProxyType(dict(getattr(state, name))))
    state.queued = frozenset(state.queued)  # type: ignore[assignment]
    state.preempting = frozenset(state.preempting)  # type: ignore[assignment]
    led = state.ledger
    led.usage = MappingProxyType(dict(led.usage))  # type: ignore[assignment]
    led.borrowed = MappingProxyType(dict(led.borrowed))  # type: ignore[assignment]
    for nested in ("gpu_equivalents", "holders"):
        inner = {k: MappingProxyType(dict(v)) for k, v in getattr(led, nested).items()}
        setattr(led, nested, MappingProxyType(inner))

    def refuse(*_: object, **__: object) -> None:
        raise AssertionError("a decider changed the live cluster state")

    cluster = state.cluster
    for method in ("apply", "unapply", "add_node", "remove_node", "set_schedulable"):
        setattr(cluster, method, refuse)


def _release_first(draft: Draft) -> None:
    lv = next(lv for lv in draft.live.values() if lv.allocations)
    draft.finish(lv, WorkloadState.RELEASED, "released")
    cycle.schedule(draft, freed=frozenset(a.flavor for a in lv.allocations))


def _node_added(draft: Draft) -> None:
    node_events.added(draft, hgx("h9", "r9", gpus=8))


DECIDERS: dict[str, Callable[[Draft], object]] = {
    "full cycle": cycle.schedule,
    "node lost": lambda d: node_events.removed(d, "h1"),
    "node added": _node_added,
    "reconcile": lambda d: node_events.reconcile(d, set()),
    "release": _release_first,
}


@pytest.mark.parametrize("name", sorted(DECIDERS))
def test_a_decider_never_writes_the_live_state(busy: Allocator, name: str) -> None:
    clock = busy.clock
    clock.advance(seconds=400)  # the preempted borrowers' grace ends: a cycle frees them
    before = busy.snapshot()

    def decide(state: State) -> Decision:
        _freeze(state)
        draft = Draft(state, clock())
        DECIDERS[name](draft)
        return draft.decision()

    # On a copy of the state whose containers are read-only, so a write raises.
    copy = _rebuilt_state(busy)
    decision = decide(copy)
    assert decision.ops, "the decider decided nothing: the test would prove nothing"
    # And on the live state itself: nothing moved.
    busy.read(lambda state: DECIDERS[name](Draft(state, clock())))
    assert busy.snapshot() == before


def _rebuilt_state(alloc: Allocator) -> State:
    now = alloc.clock()
    state = State(alloc.policy, alloc.read(lambda s: s.preemption), 24 * 3600.0)
    state.rebuild(
        alloc.read(lambda s: list(s.nodes.values())),
        alloc.store.load(),
        released_this_month(alloc.store, now),
    )
    return state


def test_the_same_state_input_and_time_give_the_same_decision(busy: Allocator) -> None:
    busy.clock.advance(seconds=400)
    now = busy.clock()
    first = busy.read(lambda s: _cycle(s, now))
    second = busy.read(lambda s: _cycle(s, now))
    assert first.ops and first == second
    # A rebuilt state (another process) decides the same too.
    assert _cycle(_rebuilt_state(busy), now).changes == first.changes


def _cycle(state: State, now: datetime) -> Decision:
    draft = Draft(state, now)
    cycle.schedule(draft)
    return draft.decision()


def test_a_refused_node_change_leaves_memory_and_database_as_they_were(
    busy: Allocator,
) -> None:
    before = busy.snapshot()
    node = next(n for n in inventory() if n.name == "h1")
    smaller = node.__class__(node.name, node.gpus[:1], node.cpu_milli, node.memory_mib)
    with pytest.raises(Conflict):
        busy.node_updated(smaller)
    assert busy.snapshot() == before
    assert isinstance(busy.cluster, ClusterState)
    assert snapshot(_rebuilt_state(busy), busy.clock()) == before
