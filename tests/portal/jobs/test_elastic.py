"""Elastic jobs in the job controller: a real allocator on a real store (SQLite and
PostgreSQL), the stand-in runner of ``conftest.py`` (STAND-IN: no process; a stop ends the
members at once), and GPU utilization given by the test (the telemetry's reading is the
boundary faked here: no GPU)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import datetime

import pytest
from sqlalchemy import select

from policies.elastic import ElasticSettings, Sample
from policies.errors import InvalidRequest
from policies.jobs import JobState
from portal.jobs.controller import JobController
from portal.jobs.elastic import resized
from portal.jobs.spec import Backend, JobSpec
from portal.store.jobs import SLICE_KEY_PREFIX, WORKLOADS
from portal.store.records import WorkloadState
from tests.portal.allocator.conftest import gpus, wl
from tests.portal.jobs.conftest import H100, Rig, job, make_backend

HOT = ElasticSettings(threshold=0.8, window_s=300, idle_s=1800)


class Gauge:
    """What the telemetry would say of each workload's GPUs: ``busy`` for every workload
    unless set, held steady over the window asked for."""

    def __init__(self, rig: Rig) -> None:
        self.rig = rig
        self.busy = 0.95
        self.of: dict[str, float] = {}

    def __call__(self, ids: Sequence[str], since: datetime) -> list[Sample]:
        now = self.rig.clock.now.timestamp()
        return [
            Sample(at, self.of.get(w, self.busy)) for w in ids for at in (since.timestamp(), now)
        ]


def elastic(lo: int = 2, hi: int = 4, gpus_each: int = 8, **kw: object) -> JobSpec:
    return replace(job(members=lo, gpus=gpus_each, **kw), max_members=hi)  # type: ignore[arg-type]


def charged_slices(rig: Rig, job_id: str) -> list[str]:
    """Slices of the job that hold devices (charged to the tenant)."""
    return [
        s.id
        for s in rig.jobs.elastic.slices(job_id)
        if s.state in (WorkloadState.RUNNING, WorkloadState.PREEMPTING)
    ]


def world_env(rig: Rig) -> list[str]:
    return [m.env["WORLD_SIZE"] for m in rig.runner.launched[-1]]


@pytest.fixture
def gauge(rig: Rig) -> Gauge:
    g = Gauge(rig)
    rig.jobs.elastic.utilization = g
    rig.jobs.elastic.retry_s = 10
    rig.jobs.elastic.set_settings("team-a", HOT)
    return g


def test_members_bound_is_checked_and_stored() -> None:
    with pytest.raises(InvalidRequest, match=r"members\.max 1: expected 2"):
        elastic(2, 1)
    spec = elastic(2, 4)
    assert spec.bounds is not None and (spec.bounds.min, spec.bounds.max) == (2, 4)
    again = JobSpec.from_dict(spec.tenant, spec.owner, spec.name, spec.to_dict())
    assert again == spec
    assert "max_members" not in job(members=2).to_dict()  # a fixed job stays as it was
    with pytest.raises(InvalidRequest, match="local backend only") as err:
        spec.check_backend(Backend.KUBERNETES)
    assert err.value.field == "members"


def test_grows_only_into_free_capacity_then_through_charged_slices(rig: Rig, gauge: Gauge) -> None:
    neighbour = rig.alloc.request(wl("team-b", gpus(8), gang=2))
    jid = rig.jobs.submit(elastic(checkpoint_dir=str(rig.ckpt))).job.id
    rig.step()
    assert world_env(rig) == ["2", "2"]
    rig.checkpoint(10)
    rig.advance(300)  # busy for the window; no capacity: the slice did not fit, none is kept
    assert rig.jobs.get(jid).attempt == 1
    assert charged_slices(rig, jid) == []
    assert [w.id for w in rig.alloc.workloads("team-a")] == [rig.jobs.get(jid).workload_id]
    rig.alloc.release(neighbour.id)
    rig.advance(10)  # the next try: a slice fits, the gang stops to resize
    j = rig.jobs.get(jid)
    assert (j.state, j.attempt) == (JobState.QUEUED, 2)
    rig.step()  # the members ended: attempt 2 launches with 3
    assert world_env(rig) == ["3", "3", "3"]
    assert {m.env["GPUPORTAL_RESUME_FROM"] for m in rig.runner.launched[-1]} == {
        str(rig.ckpt / "step-10")
    }
    rig.step(3)  # at 3 of 4, still busy: grows again
    assert world_env(rig) == ["4"] * 4
    rig.advance(600)
    assert world_env(rig) == ["4"] * 4  # at max: no more
    history = rig.jobs.attempts(jid)
    assert [(a.exit_reason, a.world_size, a.counted) for a in history] == [
        (resized(3), 2, False),
        (resized(4), 3, False),
        ("", 4, False),
    ]
    assert history[1].resume_step == 10
    assert len(charged_slices(rig, jid)) == 2
    assert sum(u.used for u in rig.alloc.usage("team-a") if u.flavor == H100) == 32
    # Every rank on its own devices: no slice placed twice.
    placed = {(m.node, m.devices) for m in rig.runner.launched[-1]}
    assert len(placed) == 4


def test_reclaim_takes_slices_before_the_gang_and_shrinks_toward_min(
    rig: Rig, gauge: Gauge
) -> None:
    jid = rig.jobs.submit(elastic(checkpoint_dir=str(rig.ckpt))).job.id
    rig.step()
    rig.advance(300)
    rig.step(4)
    assert world_env(rig) == ["4"] * 4  # 32 GPUs: 16 of them borrowed from team-b
    gauge.busy = 0.5  # no longer growing
    gang = rig.jobs.get(jid).workload_id
    claim = rig.alloc.request(wl("team-b", gpus(8), gang=2))
    rig.step(3)
    assert rig.alloc.status(claim.id).state is WorkloadState.RUNNING
    assert rig.alloc.status(gang).state is WorkloadState.RUNNING  # the gang was never evicted
    assert world_env(rig) == ["2", "2"]
    j = rig.jobs.get(jid)
    assert (j.state, j.workload_id, j.preemptions, j.restarts) == (JobState.RUNNING, gang, 0, 0)
    assert charged_slices(rig, jid) == []
    reasons = [a.exit_reason for a in rig.jobs.attempts(jid)]
    assert reasons[-1] == "" and all(r.startswith("resized to") for r in reasons[:-1])
    assert rig.jobs.attempts(jid)[-1].world_size == 2


def test_an_idle_slice_is_given_back(rig: Rig, gauge: Gauge) -> None:
    jid = rig.jobs.submit(elastic(2, 3)).job.id
    rig.step()
    rig.advance(300)
    rig.step(2)
    assert world_env(rig) == ["3"] * 3
    newest = charged_slices(rig, jid)[0]
    gauge.busy = 0.5
    gauge.of[newest] = 0.0
    rig.advance(1799)
    assert world_env(rig) == ["3"] * 3  # not idle for long enough yet
    rig.advance(2)
    rig.step()
    assert world_env(rig) == ["2", "2"]
    assert charged_slices(rig, jid) == []


def test_cancel_and_failure_release_every_slice(rig: Rig, gauge: Gauge) -> None:
    jid = rig.jobs.submit(elastic()).job.id
    rig.step()
    rig.advance(300)
    rig.step(4)
    assert len(charged_slices(rig, jid)) == 2
    rig.runner.exit(jid, rig.jobs.get(jid).attempt, 3, 1)  # a slice's rank fails
    rig.step()
    assert charged_slices(rig, jid) == []
    assert rig.jobs.get(jid).state is JobState.BACKOFF
    rig.jobs.cancel(jid)
    assert rig.alloc.workloads("team-a") == []
    keys = rig.alloc.read(lambda st: [lv.rec.idempotency_key for lv in st.live.values()])
    assert not [k for k in keys if (k or "").startswith(SLICE_KEY_PREFIX)]


def test_a_restart_gives_back_the_slices_of_jobs_no_longer_running(rig: Rig, gauge: Gauge) -> None:
    jid = rig.jobs.submit(elastic(2, 3)).job.id  # 24 of the 32 GPUs once grown
    rig.step()
    rig.advance(300)
    rig.step(2)
    held = charged_slices(rig, jid)
    assert held
    # The portal died after ending the job but before releasing its slice.
    orphan = rig.alloc.request(
        wl("team-a", gpus(8), gang=1), idempotency_key=f"{SLICE_KEY_PREFIX}gone-job/1"
    )
    assert orphan.state is WorkloadState.RUNNING
    rig.runner.adoptable = [(jid, rig.jobs.get(jid).attempt)]  # its members still run
    again = JobController(rig.alloc, backend=make_backend(rig.runner))
    again.start()
    assert rig.alloc.status(orphan.id).state is WorkloadState.RELEASED
    assert charged_slices(rig, jid) == held  # the running job keeps its own


def test_a_growth_try_never_disturbs_a_borrower_and_leaves_no_slice(rig: Rig, gauge: Gauge) -> None:
    gauge.busy = 0.5  # no growth until the borrower runs
    jid = rig.jobs.submit(elastic(1, 2)).job.id
    rig.step()
    # team-a holds 8 of its guaranteed 16; team-b's 24 take every free GPU, 8 of them
    # borrowed from team-a's guarantee: a full request of team-a would reclaim them.
    borrower = rig.alloc.request(wl("team-b", gpus(8), gang=3))
    assert borrower.state is WorkloadState.RUNNING
    gauge.busy = 0.95
    rig.advance(300)  # busy for the window: the growth try
    rig.advance(10)  # and the retry
    b = rig.alloc.status(borrower.id)
    assert (b.state, b.reason, b.preempt_deadline) == (WorkloadState.RUNNING, "", None)
    j = rig.jobs.get(jid)
    assert (j.state, j.attempt) == (JobState.RUNNING, 1)
    # Not even a released record of a slice: the try was never committed.
    with rig.alloc.store.engine.connect() as conn:
        keys = conn.execute(select(WORKLOADS.c.idempotency_key)).scalars().all()
    assert not [k for k in keys if (k or "").startswith(SLICE_KEY_PREFIX)]
    assert [w.id for w in rig.alloc.workloads("team-a")] == [j.workload_id]
