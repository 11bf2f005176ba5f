"""Active/standby ``gpuportal serve`` replicas elected with a Kubernetes Lease, against the real
kube-apiserver: one leader at a time, a standby that answers 503 and is not ready, takeover
after the leader is killed (within a lease) or stops (at once), nothing lost on the way."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from policies.errors import Unavailable
from portal.client import Portal
from portal.service.leader import Leadership, LeaseElector
from tests.portal.service.conftest import ROOT, Service, ServiceFactory, gpu
from tests.portal.service.test_writer_guard import assert_nothing_twice_or_above_a_limit
from tests.support.k8s import K8sCluster

pytestmark = [pytest.mark.k8s]

NAMESPACE = "default"


class Clock:
    """A candidate's monotonic clock, moved by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def api(k8s_cluster: K8sCluster) -> Iterator[client.ApiClient]:
    with k8s_cluster.api_client() as api_client:
        yield api_client


def lease_name() -> str:
    return f"lease-{uuid.uuid4().hex[:8]}"


def test_one_holder_renews_another_takes_over_only_after_a_silent_lease(
    api: client.ApiClient,
) -> None:
    name = lease_name()
    ca, cb = Clock(), Clock()
    a = LeaseElector(api, NAMESPACE, name, "a", duration_s=10, clock=ca)
    b = LeaseElector(api, NAMESPACE, name, "b", duration_s=10, clock=cb)
    assert a.try_lead()
    assert not b.try_lead() and b.holder == "a"
    cb.now += 9
    assert a.try_lead()  # a renews...
    cb.now += 9
    assert not b.try_lead()  # ...b sees the record changed, and times afresh from here
    cb.now += 9
    assert not b.try_lead()
    cb.now += 1  # a whole lease since b saw the last change: a is silent
    assert b.try_lead()
    assert not a.try_lead() and a.holder == "b"
    spec = client.CoordinationV1Api(api).read_namespaced_lease(name, NAMESPACE).spec
    assert (spec.holder_identity, spec.lease_transitions, spec.lease_duration_seconds) == (
        "b",
        1,
        10,
    )


def test_a_released_lease_is_taken_at_once(api: client.ApiClient) -> None:
    name = lease_name()
    a = LeaseElector(api, NAMESPACE, name, "a", duration_s=10, clock=Clock())
    b = LeaseElector(api, NAMESPACE, name, "b", duration_s=10, clock=Clock())
    assert a.try_lead()
    assert not b.try_lead()
    a.release()
    assert b.try_lead()  # no wait for the lease to expire


def test_racing_candidates_elect_exactly_one(api: client.ApiClient) -> None:
    name = lease_name()
    old = LeaseElector(api, NAMESPACE, name, "old", duration_s=5, clock=Clock())
    assert old.try_lead()
    clocks = [Clock() for _ in range(6)]
    candidates = [
        LeaseElector(api, NAMESPACE, name, f"c{i}", duration_s=5, clock=c)
        for i, c in enumerate(clocks)
    ]
    for c in candidates:
        assert not c.try_lead()  # each sees old's record now...
    for clock in clocks:
        clock.now += 6  # ...and, old silent, all see it expire
    won: list[str] = []
    start = threading.Barrier(len(candidates))

    def run(c: LeaseElector) -> None:
        start.wait()
        if c.try_lead():
            won.append(c.identity)

    threads = [threading.Thread(target=run, args=(c,)) for c in candidates]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(won) == 1, won


def wait_for(probe: Callable[[], bool], timeout_s: float, what: str) -> float:
    """Seconds until ``probe()`` is true; fails after ``timeout_s``."""
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        try:
            if probe():
                return time.monotonic() - began
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    pytest.fail(f"not within {timeout_s} s: {what}")


def status(svc: Service, path: str) -> int:
    return httpx.get(f"{svc.url}{path}", timeout=5).status_code


def replicas(
    k8s_cluster: K8sCluster, service_factory: ServiceFactory, url: str, tmp: Path
) -> tuple[Service, Service]:
    env = {
        "KUBECONFIG": str(k8s_cluster.kubeconfig_for("admin")),
        "GPUPORTAL_LEADER_ELECTION": "lease",
        "GPUPORTAL_LEASE_NAME": lease_name(),
        "GPUPORTAL_LEASE_NAMESPACE": NAMESPACE,
        "GPUPORTAL_LEASE_DURATION_S": "4",
    }
    made = []
    for who in ("first", "second"):
        made.append(
            service_factory(
                workdir=tmp / who,
                database_url=url,
                extra_env={**env, "POD_NAME": who},
            )
        )
        (tmp / who).mkdir()
    return made[0], made[1]


@pytest.mark.postgres
@pytest.mark.slow
def test_a_standby_refuses_until_the_leader_is_killed_then_serves_everything(
    k8s_cluster: K8sCluster, service_factory: ServiceFactory, postgres_url: str, tmp_path: Path
) -> None:
    first, second = replicas(k8s_cluster, service_factory, postgres_url, tmp_path)
    first.start()
    with first.client() as c:
        for i in range(3):  # 4 + 4 run (limit 8), the third waits
            r = c.post("/api/v1/workloads", json=gpu("team-a", 4, f"big-{i}"))
            assert r.status_code in (201, 202), r.text
    second.start(wait_for="/health")
    assert status(second, "/ready") == 503
    with second.client() as c:
        r = c.post("/api/v1/workloads", json=gpu("team-b", 1, "refused"))
        assert r.status_code == 503
        assert r.json()["code"] == "unavailable" and "the leader is first" in r.json()["message"]
        assert r.headers["Retry-After"] == str(r.json()["retry_after_s"])
        assert c.get("/api/v1/workloads").status_code == 503  # no stale reads either
    assert status(first, "/ready") == 200

    # No waiting allowed: the standby's 503 as it is.
    with Portal(second.url, ROOT, unavailable_wait_s=0) as c, pytest.raises(Unavailable):
        c.workloads()
    # An allocation carries an idempotency key, so it is sent again after each Retry-After
    # (2 s), until the wait allowed is spent; then the standby's answer comes back.
    began = time.monotonic()
    with (
        Portal(second.url, ROOT, unavailable_wait_s=3) as c,
        pytest.raises(Unavailable, match="the leader is first"),
    ):
        c.request("team-b", "H100-80GB", name="once")
    assert time.monotonic() - began >= 2.0

    assert first.process is not None
    first.process.kill()
    killed = time.monotonic()
    with Portal(second.url, ROOT, unavailable_wait_s=60) as patient:
        # Sent to the standby while it takes over: retried after each Retry-After until
        # the new leader answers, no error reaching the caller.
        listed = {w.name for w in patient.workloads()}
    assert listed == {"big-0", "big-1", "big-2"}
    wait_for(lambda: status(second, "/ready") == 200, 60, "the standby taking over")
    took = time.monotonic() - killed
    with second.client() as c:
        names = {w["name"]: w["state"] for w in c.get("/api/v1/workloads").json()["items"]}
        assert names == {"big-0": "running", "big-1": "running", "big-2": "queued"}
        r = c.post("/api/v1/workloads", json=gpu("team-b", 8, "b-all"))
        assert r.status_code in (201, 202), r.text
    assert_nothing_twice_or_above_a_limit(postgres_url)
    print(f"takeover after SIGKILL: {took:.1f} s (lease 4 s)")


@pytest.mark.postgres
@pytest.mark.slow
def test_a_leader_stopping_hands_over_at_once(
    k8s_cluster: K8sCluster, service_factory: ServiceFactory, postgres_url: str, tmp_path: Path
) -> None:
    first, second = replicas(k8s_cluster, service_factory, postgres_url, tmp_path)
    first.start()
    second.start(wait_for="/health")
    assert status(second, "/ready") == 503
    assert first.terminate() == 0, first.tail()
    second_ready = wait_for(lambda: status(second, "/ready") == 200, 60, "the hand-over")
    assert "gave up the lease" in first.tail(200)
    assert "Traceback" not in first.tail(500) + second.tail(500)
    assert second.terminate() == 0, second.tail()
    print(f"hand-over after SIGTERM: {second_ready:.1f} s")


def unreachable() -> client.ApiClient:
    """A client of an apiserver that is not there (a closed loopback port)."""
    from tests.support.ports import free_port

    config = client.Configuration()
    config.host = f"http://127.0.0.1:{free_port()}"
    config.retries = 0
    return client.ApiClient(config)


def test_an_unreachable_apiserver_keeps_a_standby_waiting_and_stops_a_leader(
    api: client.ApiClient,
) -> None:
    waiting = Leadership(
        LeaseElector(unreachable(), NAMESPACE, lease_name(), "w", duration_s=1.0),
        renew_s=0.05,
        renew_deadline_s=0.5,
        on_lost=lambda _why: None,
    )
    rounds = iter(range(3))
    assert not waiting.wait_elected(lambda: next(rounds, None) is None)  # no exception

    lost: list[str] = []
    elector = LeaseElector(api, NAMESPACE, lease_name(), "l", duration_s=1.0)
    leading = Leadership(elector, renew_s=0.05, renew_deadline_s=0.5, on_lost=lost.append)
    assert leading.wait_elected(lambda: False)
    elector._api = client.CoordinationV1Api(unreachable())  # the apiserver goes away
    deadline = time.monotonic() + 10
    while not lost and time.monotonic() < deadline:
        time.sleep(0.05)
    assert lost and "could not be renewed" in lost[0]
    leading.stop()
