"""A rolling upgrade of active/standby replicas, as the chart's RollingUpdate strategy runs it:
the new version's pod starts as a standby next to the old leader, the old leader gets SIGTERM
and gives the Lease up, the new one leads. Every allocation (its devices) and the queue (order
and positions) carry over, nothing is handed out twice, and the new leader takes writes.

Both processes run this checkout: a schema change between versions is the pre-upgrade Job's
work, covered by tests/portal/store/test_upgrades.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.portal.service.conftest import Service, ServiceFactory, gpu
from tests.portal.service.test_leader import replicas, status, wait_for
from tests.portal.service.test_writer_guard import (
    assert_nothing_twice_or_above_a_limit,
    database_facts,
)
from tests.support.k8s import K8sCluster

pytestmark = [pytest.mark.k8s, pytest.mark.postgres, pytest.mark.slow]

# 16 GPUs (preset hgx-h100-8=2), all held; each tenant's limit is 8 (conftest SEED), so the
# rest queue behind their tenants' quotas.
RUNNING = [("team-a", 4, "a-0"), ("team-b", 4, "b-0"), ("team-a", 4, "a-1"), ("team-b", 4, "b-1")]
QUEUED = [("team-a", 2, "a-2"), ("team-b", 4, "b-2"), ("team-a", 1, "a-3")]


def portal_state(svc: Service) -> tuple[dict[str, Any], list[tuple[str, int, int]]]:
    """Each workload's state and devices by name, and the queue (name, position, position in
    its tenant) in order, as the API reports them."""
    with svc.client() as c:
        workloads = c.get("/api/v1/workloads", params={"limit": 100}).json()["items"]
        queue = c.get("/api/v1/queue", params={"limit": 100}).json()["items"]
    by_name = {
        w["name"]: (
            w["id"],
            w["state"],
            sorted(
                (a["member"], a["node"], tuple(a["gpus"]), a["milli"]) for a in w["allocations"]
            ),
        )
        for w in workloads
    }
    return by_name, [(q["name"], q["position"], q["tenant_position"]) for q in queue]


def facts(url: str) -> tuple[list[tuple[str, str, int, int]], list[tuple[str, int, int]]]:
    """What the database says is held: per tenant and flavor, and per GPU (in a fixed order)."""
    held, per_gpu = database_facts(url)
    return sorted(held), per_gpu


def test_a_rolling_upgrade_keeps_every_allocation_and_the_queue(
    k8s_cluster: K8sCluster, service_factory: ServiceFactory, postgres_url: str, tmp_path: Path
) -> None:
    old, new = replicas(k8s_cluster, service_factory, postgres_url, tmp_path)
    old.start()
    with old.client() as c:
        for tenant, n, name in RUNNING + QUEUED:
            r = c.post("/api/v1/workloads", json=gpu(tenant, n, name))
            assert r.status_code in (201, 202), r.text
    workloads, queue = portal_state(old)
    assert {n for n, (_, s, _) in workloads.items() if s == "running"} == {n for *_, n in RUNNING}
    # The queue's order is the allocator's (fair share, not arrival); it must survive as is.
    assert sorted(n for n, *_ in queue) == sorted(n for *_, n in QUEUED)
    assert [p for _, p, _ in queue] == [1, 2, 3]
    devices = facts(postgres_url)

    # The new version's pod: a standby while the old leader serves.
    new.start(wait_for="/health")
    assert status(new, "/ready") == 503
    assert status(old, "/ready") == 200
    # The rollout takes the old pod away: SIGTERM; it hands the Lease over on its way out.
    assert old.terminate() == 0, old.tail()
    wait_for(lambda: status(new, "/ready") == 200, 60, "the new version leading")
    assert "gave up the lease" in old.tail(200)

    assert portal_state(new) == (workloads, queue)
    assert facts(postgres_url) == devices
    assert_nothing_twice_or_above_a_limit(postgres_url)

    # Writes go on under the new leader: a release frees 4 of team-a's quota, which admits
    # the queue's team-a entries; team-b's stays queued, first.
    with new.client() as c:
        released = c.delete(f"/api/v1/workloads/{workloads['a-0'][0]}")
        assert released.status_code == 200, released.text

        def state(name: str) -> str:
            answer: str = c.get(f"/api/v1/workloads/{workloads[name][0]}").json()["state"]
            return answer

        wait_for(lambda: state("a-2") == state("a-3") == "running", 30, "the queue admitted")
        r = c.post("/api/v1/workloads", json=gpu("team-b", 1, "after"))
        assert r.status_code == 202, r.text  # team-b is at its limit
    _, after = portal_state(new)
    assert sorted(after) == [("after", 2, 2), ("b-2", 1, 1)]
    assert_nothing_twice_or_above_a_limit(postgres_url)
    assert "Traceback" not in old.tail(500) + new.tail(500)
    assert new.terminate() == 0, new.tail()
