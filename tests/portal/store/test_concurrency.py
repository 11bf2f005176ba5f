"""Several threads committing at once: no "database is locked", no double claims."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable

from policies.errors import Conflict
from portal.store.records import ChangeSet
from portal.store.writer import Store
from tests.portal.store.builders import allocation, at, quota, workload

THREADS = 8
WAIT_S = 60  # a broken barrier fails the test instead of hanging it


def run_threads(target: Callable[[int], None], count: int = THREADS) -> list[BaseException]:
    """Run ``target(i)`` in ``count`` threads started together; return what they raised."""
    errors: list[BaseException] = []
    start = threading.Barrier(count, timeout=WAIT_S)

    def body(i: int) -> None:
        try:
            start.wait()
            target(i)
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=4 * WAIT_S)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    return errors


def test_disjoint_writers_and_readers_all_succeed(acme: Store) -> None:
    rounds = 20
    stop = threading.Event()
    seen: list[int] = []

    def work(i: int) -> None:
        if i >= THREADS - 2:  # two readers
            while not stop.is_set():
                seen.append(len(acme.load().allocations))
            return
        node = f"node-{i}"
        for r in range(rounds):
            wid, aid = f"w{i}-{r}", f"a{i}-{r}"
            released = [(f"a{i}-{r - 1}", at(r))] if r else []
            acme.commit(
                ChangeSet(
                    workloads=[workload(wid)],
                    released=released,
                    allocations=[allocation(aid, wid, (0, 1, 2, 3), node=node)],
                )
            )
        if i == 0:
            stop.set()

    errors = run_threads(work)
    stop.set()
    assert errors == []
    writers = THREADS - 2
    assert len(acme.load().allocations) == writers
    assert len(acme.allocations_between(at(-1), at(100))) == writers * rounds
    assert seen and max(seen) <= writers


def test_racing_claims_on_one_gpu_have_exactly_one_winner(acme: Store) -> None:
    rounds = 10
    acme.commit(ChangeSet(workloads=[workload(f"w{i}") for i in range(THREADS)]))
    outcome: Counter[str] = Counter()
    between_rounds = threading.Barrier(THREADS, timeout=WAIT_S)

    def race(i: int) -> None:
        for r in range(rounds):
            try:
                acme.commit(
                    ChangeSet(allocations=[allocation(f"a{i}-{r}", f"w{i}", (r % 8,), node="hot")])
                )
                outcome["won"] += 1
            except Conflict as err:
                assert f"GPU {r % 8} on hot is already held" in err.message
                outcome["lost"] += 1
            between_rounds.wait()
            if i == 0:  # free the GPU for a later round
                (winner,) = [a for a in acme.load().allocations if a.gpus == (r % 8,)]
                acme.commit(ChangeSet(released=[(winner.id, at(r))]))
            between_rounds.wait()

    errors = run_threads(race)
    assert errors == []
    assert outcome == {"won": rounds, "lost": rounds * (THREADS - 1)}
    assert acme.load().allocations == []


def test_racing_quota_updates_have_exactly_one_winner(acme: Store) -> None:
    acme.commit(ChangeSet(quotas=[quota(limit=1)]))
    wins: list[int] = []

    def bump(i: int) -> None:
        try:
            acme.commit(ChangeSet(quotas=[quota(limit=10 + i, version=2)]))
            wins.append(i)
        except Conflict:
            pass

    assert run_threads(bump) == []
    (winner,) = wins
    (stored,) = acme.load().quotas
    assert (stored.limit, stored.version) == (10 + winner, 2)
