"""``gpuportal serve`` killed with SIGKILL in the middle of a burst of concurrent requests,
releases and quota edits, then restarted on the same database, several rounds in a row.

Only what a client saw acknowledged (a 2xx answer it received whole) is promised. After each
restart the test checks, through the API, that every acknowledged creation, release and quota
edit is there (in its acknowledged state or a later legal one), and that retrying every request
with its Idempotency-Key (acknowledged or cut off by the kill) gives exactly one workload per
key. Before and after the retries it reads the database directly, only to check the API against
it: no device is held twice, no tenant is above a limit, every live workload shows the
allocations the database holds for it, and the usage the API reports is what they sum to.

Requests and kill points are drawn from a seeded generator (``TEST_SEED``), so a failing round's
draws can be repeated; the threads' interleaving with the server cannot be, so run a failing
seed a few times.
"""

from __future__ import annotations

import json
import os
import random
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from policies import mig
from policies.flavors import Flavor, FlavorKind
from tests.portal.service.conftest import Service, ServiceFactory, database_url

pytestmark = pytest.mark.slow

# One H100 board with two GPUs cut into MIG instances and six whole, and two shareable T4s.
INVENTORY = """\
version: 1
nodes:
  - name: hgx
    preset: hgx-h100-8
    mig:
      0: ["3g.40gb@0", "1g.10gb@4", "1g.10gb@5", "1g.10gb@6"]
      1: ["1g.10gb@0", "1g.10gb@1", "1g.10gb@2", "1g.10gb@3", "1g.10gb@4", "1g.10gb@5",
          "1g.10gb@6"]
  - name: t4
    preset: t4-2
"""
TENANTS = ("team-a", "team-b", "team-c")
QUOTAS = {
    "H100-80GB": (2, 3),
    "H100-80GB/1g.10gb": (3, 4),
    "H100-80GB/3g.40gb": (0, 1),
    "T4": (0, 1),
    "T4/share": (500, 1000),
}
"""(guaranteed, limit) of each tenant: more is asked for than fits, so some requests queue,
some borrow, and releases and raised limits admit queued ones."""
COHORTS = {"team-a": "lab", "team-b": "lab", "team-c": None}
"""team-a and team-b lend each other unused guaranteed quota, so reclaims preempt borrowers."""
TENANT_SEED = {
    "tenants": {
        t: {
            "cohort": COHORTS[t],
            "quotas": {fl: {"guaranteed": g, "limit": lim} for fl, (g, lim) in QUOTAS.items()},
        }
        for t in TENANTS
    }
}
SHAPES: tuple[dict[str, Any], ...] = (
    {"kind": "gpu", "count": 1, "models": ["H100-80GB"]},
    {"kind": "gpu", "count": 2, "models": ["H100-80GB"]},
    {"kind": "mig", "mig_profile": "1g.10gb", "models": ["H100-80GB"]},
    {"kind": "mig", "mig_profile": "3g.40gb", "models": ["H100-80GB"]},
    {"kind": "gpu", "count": 1, "models": ["T4"]},
    {"kind": "share", "milli": 250, "gpu_memory_mib": 2048, "models": ["T4"]},
    {"kind": "share", "milli": 400, "gpu_memory_mib": 4096, "models": ["T4"]},
)
ROUNDS = 3
CLIENTS = 8
KILL_AFTER_ANSWERS = (15, 150)
"""The server is killed once this many answers of the round have arrived (uniform, from the
round's seed), which stays a point inside the burst however loaded the machine is."""
BURST_TIMEOUT_S = 60.0
LIMIT_CEILING = 6
"""Quota edits raise limits by one up to here: limits only grow, so none is ever legitimately
below what a tenant already holds."""
LIVE = frozenset({"running", "preempting"})
TERMINAL = frozenset({"released", "cancelled", "failed"})
SEED = int(os.environ.get("TEST_SEED", "20261201"))
"""Seeds every round's clients and kill point; set TEST_SEED to replay or to try others."""


@dataclass
class Creation:
    """A POST /workloads as sent; ``ack`` is the answer, when one was received whole."""

    key: str
    body: dict[str, Any]
    ack: dict[str, Any] | None = None


@dataclass
class Ledger:
    """What the clients sent and what was acknowledged, across rounds (the database too)."""

    creations: dict[str, Creation] = field(default_factory=dict)
    release_sent: set[str] = field(default_factory=set)
    releases: dict[str, str] = field(default_factory=dict)
    """Workload id → the state its acknowledged DELETE reported (terminal, so final)."""
    quotas: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    """(tenant, flavor) → the newest acknowledged PUT's answer."""
    in_flight: int = 0
    """Requests sent whose answer has not arrived yet."""
    answered: int = 0
    unexpected: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def acknowledged_ids(self) -> list[str]:
        with self.lock:
            return [c.ack["id"] for c in self.creations.values() if c.ack is not None]


def client_loop(
    svc: Service,
    ledger: Ledger,
    rng: random.Random,
    name: str,
    ready: threading.Barrier,
    stop: threading.Event,
) -> None:
    """Random creations, releases and quota raises from when every client is ready until the
    server dies or ``stop``."""
    n = 0
    with svc.client() as c:
        ready.wait()
        while not stop.is_set():
            op = rng.random()
            try:
                if op < 0.55:
                    n += 1
                    create(c, ledger, rng, f"{name}-{n}")
                elif op < 0.9:
                    release(c, ledger, rng)
                else:
                    raise_limit(c, ledger, rng)
            except httpx.TransportError:
                return  # the server is gone


def create(c: httpx.Client, ledger: Ledger, rng: random.Random, key: str) -> None:
    body = {
        "tenant": rng.choice(TENANTS),
        "name": key,
        "devices": dict(rng.choice(SHAPES)),
        "kind": rng.choice(("notebook", "job")),
        "priority": rng.choice((0, 0, 10)),
        "expected_duration_s": 600,
    }
    creation = Creation(key, body)
    with ledger.lock:
        ledger.creations[key] = creation
    with sending(ledger):
        r = c.post("/api/v1/workloads", json=body, headers={"Idempotency-Key": key})
    if r.status_code not in (201, 202):
        with ledger.lock:
            ledger.unexpected.append(f"POST {key}: {r.status_code} {r.text}")
        return
    with ledger.lock:
        creation.ack = r.json()


def release(c: httpx.Client, ledger: Ledger, rng: random.Random) -> None:
    with ledger.lock:
        released = set(ledger.releases)
    ids = ledger.acknowledged_ids()
    if not ids:
        return
    # Mostly workloads not released yet (so the queue moves); sometimes a repeat (idempotent).
    fresh = [i for i in ids if i not in released]
    wid = rng.choice(fresh if fresh and rng.random() < 0.8 else ids)
    with ledger.lock:
        ledger.release_sent.add(wid)
    with sending(ledger):
        r = c.delete(f"/api/v1/workloads/{wid}")
    with ledger.lock:
        if r.status_code != 200:
            ledger.unexpected.append(f"DELETE {wid}: {r.status_code} {r.text}")
        elif r.json()["state"] not in TERMINAL:
            ledger.unexpected.append(f"DELETE {wid} answered {r.json()['state']}")
        else:
            ledger.releases[wid] = r.json()["state"]


def raise_limit(c: httpx.Client, ledger: Ledger, rng: random.Random) -> None:
    tenant, flavor = rng.choice(TENANTS), rng.choice(list(QUOTAS))
    path = f"/api/v1/tenants/{tenant}/quotas/{flavor}"
    got = c.get(path)
    if got.status_code != 200:
        with ledger.lock:
            ledger.unexpected.append(f"GET {path}: {got.status_code} {got.text}")
        return
    quota = got.json()
    if quota["limit"] >= LIMIT_CEILING:
        return
    with sending(ledger):
        r = c.put(
            path,
            json={"guaranteed": quota["guaranteed"], "limit": quota["limit"] + 1},
            headers={"If-Match": got.headers["ETag"]},
        )
    with ledger.lock:
        if r.status_code == 412:
            return  # another client raised it first: not acknowledged, nothing promised
        if r.status_code != 200:
            ledger.unexpected.append(f"PUT {path}: {r.status_code} {r.text}")
            return
        newest = ledger.quotas.get((tenant, flavor))
        if newest is None or r.json()["version"] > newest["version"]:
            ledger.quotas[(tenant, flavor)] = r.json()


@contextmanager
def sending(ledger: Ledger) -> Iterator[None]:
    """Counts the request as in flight until its answer arrives (or never does)."""
    with ledger.lock:
        ledger.in_flight += 1
    yield
    with ledger.lock:
        ledger.in_flight -= 1
        ledger.answered += 1


def burst_then_kill(
    svc: Service, ledger: Ledger, rng: random.Random, round_no: int
) -> tuple[str, int]:
    """Run the clients, SIGKILL the server at a random point; returns that point in words and
    how many requests were in flight then."""
    stop = threading.Event()
    ready = threading.Barrier(CLIENTS + 1)  # building a client takes a while: not in the burst
    threads = [
        threading.Thread(
            target=client_loop,
            args=(svc, ledger, random.Random(rng.random()), f"r{round_no}-c{i}", ready, stop),
        )
        for i in range(CLIENTS)
    ]
    kill_after = ledger.answered + rng.randint(*KILL_AFTER_ANSWERS)
    for t in threads:
        t.start()
    try:
        ready.wait(30)
        start = time.monotonic()
        while ledger.answered < kill_after:
            assert time.monotonic() - start < BURST_TIMEOUT_S, "the burst is too slow"
            time.sleep(0.001)
        with ledger.lock:
            in_flight = ledger.in_flight
        svc.kill()  # SIGKILL: no shutdown code of the server runs
        killed_at = time.monotonic() - start
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    ledger.in_flight = 0
    return f"killed at answer {kill_after}, {killed_at:.2f} s into the burst", in_flight


def pages(c: httpx.Client, path: str) -> Iterator[dict[str, Any]]:
    offset: int | None = 0
    while offset is not None:
        r = c.get(path, params={"limit": 500, "offset": offset})
        assert r.status_code == 200, r.text
        yield from r.json()["items"]
        offset = r.json()["next_offset"]


def devices(allocations: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return sorted(
        (a["id"], a["node"], tuple(a["gpus"]), a["mig_profile"], a["mig_start"], a["milli"])
        for a in allocations
    )


def check_acknowledged(c: httpx.Client, ledger: Ledger) -> None:
    """Every acknowledged answer still holds, or has moved on only the way it may."""
    for creation in ledger.creations.values():
        ack = creation.ack
        if ack is None:
            continue
        r = c.get(f"/api/v1/workloads/{ack['id']}")
        assert r.status_code == 200, f"acknowledged {creation.key} lost: {r.status_code} {r.text}"
        now = r.json()
        released = ledger.releases.get(ack["id"])
        if released is not None:
            assert now["state"] == released, (creation.key, "released, then", now)
            continue
        legal = {"running", "preempting"}
        if ack["state"] == "queued":
            legal.add("queued")
        if ack["id"] in ledger.release_sent:
            legal |= {"released", "cancelled"}
        elif now["state"] == "released":
            legal.add("released")  # preempted: its grace period ended
            assert now["reason"] == "preempted", (creation.key, "ended by itself", now)
        assert now["state"] in legal, (creation.key, ack["state"], "then", now["state"])
        if ack["state"] in LIVE and now["state"] in LIVE:
            assert devices(now["allocations"]) == devices(ack["allocations"]), (
                f"{creation.key} moved: acknowledged on {devices(ack['allocations'])}, "
                f"now on {devices(now['allocations'])}"
            )
    for (tenant, flavor), ack in ledger.quotas.items():
        now = c.get(f"/api/v1/tenants/{tenant}/quotas/{flavor}").json()
        assert now["version"] >= ack["version"], (tenant, flavor, ack, now)
        assert now["limit"] >= ack["limit"], (tenant, flavor, ack, now)
        assert now["guaranteed"] == ack["guaranteed"], (tenant, flavor, ack, now)


def retry_every_creation(c: httpx.Client, ledger: Ledger, db: sa.Engine) -> tuple[int, int]:
    """The same key again gives the same workload, whether or not the first answer arrived.
    Returns how many unanswered creations the kill left stored, and how many it left unstored."""
    before = dict(keyed_workloads(db))
    unanswered = [k for k, cr in ledger.creations.items() if cr.ack is None]
    stored = sum(k in before for k in unanswered)

    def again(creation: Creation) -> httpx.Response:
        return c.post(
            "/api/v1/workloads", json=creation.body, headers={"Idempotency-Key": creation.key}
        )

    # Each key twice at once: a retry may race the client's own second retry.
    with ThreadPoolExecutor(CLIENTS) as pool:
        answers = list(pool.map(again, [cr for cr in ledger.creations.values() for _ in "12"]))
    for i, creation in enumerate(ledger.creations.values()):
        first, second = answers[2 * i], answers[2 * i + 1]
        for r in (first, second):
            assert r.status_code in (201, 202), (creation.key, r.status_code, r.text)
        wid = first.json()["id"]
        assert second.json()["id"] == wid, (creation.key, first.json(), second.json())
        if creation.ack is not None:
            assert wid == creation.ack["id"], (
                creation.key,
                "acknowledged",
                creation.ack,
                first.json(),
            )
        if creation.key in before:
            assert [wid] == before[creation.key], (creation.key, wid, before[creation.key])
        creation.ack = creation.ack or first.json()
    after = keyed_workloads(db)
    keys = [k for k, _ in after]
    assert keys == sorted(ledger.creations), "workloads without a request, or lost"
    doubled = {k: ids for k, ids in after if len(ids) != 1}
    assert not doubled, doubled
    return stored, len(unanswered) - stored


def keyed_workloads(db: sa.Engine) -> list[tuple[str | None, list[str]]]:
    with db.connect() as conn:
        rows = conn.execute(sa.text("SELECT idempotency_key, id FROM workloads")).all()
    by_key: dict[str | None, list[str]] = defaultdict(list)
    for key, wid in rows:
        by_key[key].append(wid)
    return sorted(by_key.items(), key=lambda kv: str(kv[0]))


def check_devices_and_usage(c: httpx.Client, db: sa.Engine) -> None:
    """The database's active allocations hold no device twice, fit every limit, are what the
    API shows for each live workload, and sum to the usage the API reports."""
    with db.connect() as conn:
        rows = conn.execute(
            sa.text(
                "SELECT a.id, a.workload_id, w.tenant, w.state, a.node, a.flavor, a.amount,"
                " a.gpus, a.milli, a.mig_profile, a.mig_start"
                " FROM allocations a JOIN workloads w ON w.id = a.workload_id"
                " WHERE a.released_at IS NULL"
            )
        ).all()
    held: dict[tuple[str, int], list[tuple[str, str, Any]]] = defaultdict(list)
    used: Counter[tuple[str, str]] = Counter()
    by_workload: dict[str, list[str]] = defaultdict(list)
    for aid, wid, tenant, state, node, flavor, amount, gpus, milli, profile, start in rows:
        assert state in LIVE, f"allocation {aid} still active for a {state} workload {wid}"
        fl = Flavor.parse(flavor)
        share: Any = None  # what of the GPU it holds: all of it, milli, or MIG memory slices
        if fl.kind is FlavorKind.SHARE:
            share = milli
        elif fl.kind is FlavorKind.MIG:
            size = mig.geometry(fl.model).profiles[profile].memory_slices
            share = range(start, start + size)
        for g in json.loads(gpus) if isinstance(gpus, str) else gpus:
            held[(node, g)].append((wid, fl.kind.value, share))
        used[(tenant, flavor)] += amount
        by_workload[wid].append(aid)
    for (node, g), holders in held.items():
        kinds = {k for _, k, _ in holders}
        assert len(kinds) == 1, f"{node} GPU {g} held as {kinds}: {holders}"
        (kind,) = kinds
        if kind == "gpu":
            assert len(holders) == 1, f"{node} GPU {g} held twice: {holders}"
        elif kind == "share":
            assert sum(m for _, _, m in holders) <= 1000, f"{node} GPU {g} over-shared: {holders}"
        else:
            slices = Counter(s for _, _, r in holders for s in r)
            assert max(slices.values()) == 1, f"{node} GPU {g} MIG slices overlap: {holders}"
    live = {w["id"]: w for w in pages(c, "/api/v1/workloads") if w["state"] in LIVE}
    assert sorted(live) == sorted(by_workload), "live workloads in the API and the database"
    for wid, w in live.items():
        shown = sorted(a["id"] for a in w["allocations"])
        assert shown == sorted(by_workload[wid]), (wid, "API", shown, "database", by_workload[wid])
    for u in pages(c, "/api/v1/usage"):
        key = (u["tenant"], u["flavor"])
        assert u["used"] == used.pop(key, 0), (key, u)
        assert u["used"] <= u["limit"], f"{key} above its limit: {u}"
    assert not +used, f"allocations the usage does not show: {dict(used)}"


@pytest.mark.parametrize("db", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_sigkill_during_a_burst_loses_nothing_acknowledged_and_doubles_nothing_retried(
    service_factory: ServiceFactory, request: pytest.FixtureRequest, tmp_path: Path, db: str
) -> None:
    url = database_url(db, request, tmp_path)
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    svc = service_factory(database_url=url, inventory=f"file:{tmp_path / 'inventory.yaml'}")
    rng = random.Random(f"{SEED}-{db}")
    ledger = Ledger()
    engine = sa.create_engine(url)
    try:
        svc.start(seed=TENANT_SEED)
        for round_no in range(ROUNDS):
            killed_at, in_flight = burst_then_kill(svc, ledger, rng, round_no)
            where = f"round {round_no} (TEST_SEED={SEED}, {killed_at})"
            acknowledged = len(ledger.acknowledged_ids())
            assert not ledger.unexpected, (where, ledger.unexpected)
            assert in_flight, f"{where}: no request was in flight at the kill"
            restart = time.monotonic()
            svc.start(seed=None)
            check = time.monotonic()
            with svc.client() as c:
                try:
                    check_devices_and_usage(c, engine)
                    check_acknowledged(c, ledger)
                    stored, unstored = retry_every_creation(c, ledger, engine)
                    check_devices_and_usage(c, engine)
                    states = Counter(w["state"] for w in pages(c, "/api/v1/workloads"))
                except AssertionError as err:
                    raise AssertionError(f"{where}: {err}") from err
            print(
                f"{where}: {acknowledged} creations acknowledged so far, {in_flight} requests "
                f"in flight at the kill, of the unanswered creations {stored} were stored and "
                f"{unstored} not; {len(ledger.releases)} releases and {len(ledger.quotas)} "
                f"quota edits acknowledged; live now: {dict(states)}; restart "
                f"{check - restart:.1f} s, checks {time.monotonic() - check:.1f} s"
            )
    finally:
        svc.kill()
        engine.dispose()
