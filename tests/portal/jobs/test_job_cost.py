"""What a job cost: its attempts' (and an elastic job's slices') allocations priced by the
accounting, on SQLite and PostgreSQL, through ``GET /api/v1/jobs/{id}/cost`` on the manual
clock of the rig (the stand-in runner of ``conftest``)."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import datetime, timedelta
from fractions import Fraction

import pytest
from fastapi.testclient import TestClient

from policies.elastic import ElasticSettings, Sample
from policies.jobs import JobState
from portal.accounting.prices import price_config
from portal.accounting.service import Accounting
from portal.accounting.workloads import workload_costs
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.api.cost import use_accounting
from portal.store.jobs import slice_key_prefix
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import gpus, wl
from tests.portal.api.conftest import TOKENS, auth
from tests.portal.jobs.conftest import H100, Rig, job

PRICES = price_config({"currency": "EUR", "prices": {H100: "3.00"}})


@pytest.fixture
def api(rig: Rig) -> Iterator[TestClient]:
    app = create_app(rig.alloc, StaticAuthenticator(TOKENS), job_controller=rig.jobs)
    use_accounting(app, Accounting(rig.alloc.store, PRICES, clock=rig.clock))
    with TestClient(app) as client:
        yield client


def test_a_preempted_and_resumed_job_costs_its_held_time_and_not_its_waits(
    rig: Rig, api: TestClient
) -> None:
    rig.runner.stop_ends_members = False  # members checkpoint before they exit
    # team-b holds 8 of the 32 GPUs: the 4 x 8 gang waits, holding nothing, for 10 minutes.
    blocker = rig.alloc.request(wl("team-b", gpus(8)))
    jid = rig.jobs.submit(job(members=4, gpus=8)).job.id
    rig.advance(600)
    assert rig.jobs.get(jid).state is JobState.QUEUED
    assert api.get(f"/api/v1/jobs/{jid}/cost", headers=auth("alice")).json()["cost"] == "0.00"
    rig.alloc.release(blocker.id)
    rig.step()
    assert rig.jobs.get(jid).state is JobState.RUNNING
    rig.clock.advance(seconds=1800)  # attempt 1 runs half an hour on 32 GPUs

    # team-b reclaims its 16: the members take 30 s of the grace to checkpoint, and the
    # devices are held (and charged) until they have ended.
    claimant = rig.alloc.request(wl("team-b", gpus(8), gang=2))
    rig.step()
    assert rig.jobs.attempts(jid)[0].exit_reason == "preempted by team-b reclaim"
    rig.advance(30)
    for rank in range(4):
        rig.runner.exit(jid, 1, rank, 143)
    rig.step()
    assert rig.alloc.status(claimant.id).state is WorkloadState.RUNNING
    # Attempt 2 waits a quarter of an hour behind the claimant (free of charge)...
    rig.advance(900)
    assert rig.jobs.get(jid).state is JobState.QUEUED and rig.jobs.get(jid).attempt == 2
    rig.alloc.release(claimant.id)
    rig.step()
    assert rig.jobs.get(jid).state is JobState.RUNNING
    rig.clock.advance(seconds=900)  # ...and runs a quarter of an hour.
    for rank in range(4):
        rig.runner.exit(jid, 2, rank, 0)
    rig.step()
    assert rig.jobs.get(jid).state is JobState.SUCCEEDED
    rig.clock.advance(seconds=3600)  # ended: nothing more is charged

    r = api.get(f"/api/v1/jobs/{jid}/cost", headers=auth("alice"))
    assert r.status_code == 200, r.text
    cost = r.json()
    # Attempt 1: 32 GPUs x 1830 s = 16.2667 GPU-hours at 3.00 = 48.80; attempt 2: 32 x 900 s
    # = 8 GPU-hours = 24.00.
    assert [(a["number"], a["exit_reason"], a["cost"]) for a in cost["attempts"]] == [
        (1, "preempted by team-b reclaim", "48.80"),
        (2, "completed", "24.00"),
    ]
    assert cost["attempts"][0]["gpu_hours"] == pytest.approx(32 * 1830 / 3600)
    assert cost["attempts"][1]["gpu_hours"] == pytest.approx(8)
    assert (cost["cost"], cost["currency"], cost["unpriced_models"]) == ("72.80", "EUR", [])
    assert cost["gpu_hours"] == pytest.approx(32 * 1830 / 3600 + 8)
    assert cost["tenant"] == "team-a"
    # One price: team-a ran nothing else, so its /cost total is exactly the job's.
    acc = Accounting(rig.alloc.store, PRICES, clock=rig.clock)
    ids = [a.workload_id for a in rig.jobs.attempts(jid)]
    exact = workload_costs(acc, ids).total().cost
    assert exact == Fraction("72.80")
    start = rig.clock.now - timedelta(days=1)
    assert acc.report(start, rig.clock.now, tenants=["team-a"]).total().cost == exact


def test_a_running_attempt_is_charged_up_to_now(rig: Rig, api: TestClient) -> None:
    jid = rig.jobs.submit(job(members=2, gpus=8)).job.id
    rig.step()
    rig.clock.advance(seconds=450)  # 16 GPUs for 7.5 minutes: 2 GPU-hours
    cost = api.get(f"/api/v1/jobs/{jid}/cost", headers=auth("alice")).json()
    assert (cost["cost"], cost["attempts"][0]["exit_reason"]) == ("6.00", "")
    rig.clock.advance(seconds=450)
    assert api.get(f"/api/v1/jobs/{jid}/cost", headers=auth("alice")).json()["cost"] == "12.00"


def test_unpriced_models_are_named_and_counted_at_zero(rig: Rig) -> None:
    app = create_app(rig.alloc, StaticAuthenticator(TOKENS), job_controller=rig.jobs)
    use_accounting(app, Accounting(rig.alloc.store, clock=rig.clock))  # no prices at all
    jid = rig.jobs.submit(job(members=1, gpus=8)).job.id
    rig.step()
    rig.clock.advance(seconds=3600)
    with TestClient(app) as client:
        cost = client.get(f"/api/v1/jobs/{jid}/cost", headers=auth("alice")).json()
    assert (cost["cost"], cost["unpriced_models"]) == ("0.00", [H100])
    assert cost["gpu_hours"] == pytest.approx(8)


def test_another_tenant_gets_403_and_an_unknown_job_404(rig: Rig, api: TestClient) -> None:
    jid = rig.jobs.submit(job(members=1, gpus=8)).job.id
    rig.step()
    r = api.get(f"/api/v1/jobs/{jid}/cost", headers=auth("bob"))
    assert (r.status_code, r.json()["code"]) == (403, "forbidden")
    r = api.get("/api/v1/jobs/nope/cost", headers=auth("alice"))
    assert (r.status_code, r.json()["code"]) == (404, "not_found")


def test_an_elastic_job_costs_its_slices_too(rig: Rig, api: TestClient) -> None:
    busy = 0.5

    def gauge(ids: Sequence[str], since: datetime) -> list[Sample]:
        return [
            Sample(at, busy) for _ in ids for at in (since.timestamp(), rig.clock.now.timestamp())
        ]

    rig.jobs.elastic.utilization = gauge
    rig.jobs.elastic.set_settings("team-a", ElasticSettings(threshold=0.8, window_s=300))
    spec = replace(job(members=1, gpus=8), max_members=2)
    jid = rig.jobs.submit(spec).job.id
    rig.step()  # the gang: 8 GPUs from now
    rig.clock.advance(seconds=300)
    busy = 0.95
    rig.step()  # a slice: 8 more GPUs from now, the attempt resizes
    rig.step()
    assert rig.jobs.attempts(jid)[-1].world_size == 2
    (slice_,) = rig.jobs.elastic.slices(jid)
    # Another owner's workload under the job's slice key is not the job's.
    other = rig.alloc.request(
        wl("team-a", gpus(8), owner="mallory"), idempotency_key=f"{slice_key_prefix(jid)}x"
    )
    rig.clock.advance(seconds=1500)
    rig.jobs.cancel(jid)  # releases the gang and the slice
    rig.alloc.release(other.id)
    rig.clock.advance(seconds=3600)  # ended: nothing more is charged

    cost = api.get(f"/api/v1/jobs/{jid}/cost", headers=auth("alice")).json()
    # Gang: 8 GPUs x 1800 s = 4 GPU-hours = 12.00; slice: 8 x 1500 s = 3.3333 = 10.00.
    assert [(s["workload_id"], s["cost"]) for s in cost["slices"]] == [(slice_.id, "10.00")]
    assert {a["cost"] for a in cost["attempts"]} == {"12.00"}  # resizes share the gang
    assert cost["cost"] == "22.00"
    assert cost["gpu_hours"] == pytest.approx(4 + 8 * 1500 / 3600)
    assert rig.jobs.gpu_hours(jid) == pytest.approx(cost["gpu_hours"])
    got = api.get(f"/api/v1/jobs/{jid}", headers=auth("alice")).json()["gpu_hours"]
    assert got == pytest.approx(cost["gpu_hours"])
    # The tenant's /cost counts the same workloads, plus mallory's (8 x 1500 s = 10.00).
    acc = Accounting(rig.alloc.store, PRICES, clock=rig.clock)
    start = rig.clock.now - timedelta(days=1)
    assert acc.report(start, rig.clock.now, tenants=["team-a"]).total().cost == Fraction("32.00")
