"""Elastic jobs wired as ``gpuportal serve`` wires them (``portal.jobs.service.wire_elastic``):
utilization read back from the telemetry store, fed by real sample batches for the job's
devices through the real ingest and attribution (the NVML agent's boundary: no GPU here), and
the tenant's settings from the database."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

import pytest

from policies.elastic import ElasticSettings
from portal.jobs.service import ELASTIC_CHECK_S, wire_elastic
from portal.store.records import WorkloadState
from portal.telemetry.service import Telemetry
from portal.telemetry.wire import SampleBatch
from tests.portal.jobs.conftest import Rig, job


@pytest.fixture
def telemetry(rig: Rig) -> Telemetry:
    wire_elastic(rig.jobs, rig.alloc.store.engine)
    rig.jobs.elastic.save(
        "team-a",
        ElasticSettings(threshold=0.8, window_s=300, idle_s=600),
        None,
        platform=True,
        expected_version=0,
    )
    return Telemetry(rig.alloc, clock=lambda: rig.clock.now.timestamp(), attribution_ttl_s=0)


def report(rig: Rig, telemetry: Telemetry, pct: dict[str, float], default: float) -> None:
    """One sample per GPU each running team-a workload holds: ``pct[workload]`` or
    ``default`` percent busy, stamped now, sent per node as the agent sends them."""
    at = rig.clock.now.timestamp()
    per_node: dict[str, list[dict[str, object]]] = defaultdict(list)
    for w in rig.alloc.workloads("team-a"):
        status = rig.alloc.status(w.id, estimate=False)
        if status.state is not WorkloadState.RUNNING:
            continue
        for a in status.allocations:
            for gpu in a.gpu_uuids:
                per_node[a.node].append(
                    {
                        "gpu_uuid": gpu,
                        "at": at,
                        "utilization_pct": pct.get(w.id, default),
                        "memory_used_mib": 1000.0,
                        "memory_total_mib": 81920.0,
                    }
                )
    for node, samples in per_node.items():
        batch = SampleBatch.model_validate({"node": node, "source": "nvml", "samples": samples})
        assert telemetry.ingest(batch).accepted == len(samples)


def run_for(
    rig: Rig, telemetry: Telemetry, seconds: int, pct: dict[str, float], default: float
) -> None:
    """Samples every ``ELASTIC_CHECK_S`` for ``seconds``, the jobs loop after each."""
    for _ in range(int(seconds / ELASTIC_CHECK_S)):
        report(rig, telemetry, pct, default)
        rig.advance(ELASTIC_CHECK_S)


def world(rig: Rig) -> int:
    return len(rig.runner.launched[-1])


def test_busy_samples_grow_the_job_and_an_idle_slice_is_given_back(
    rig: Rig, telemetry: Telemetry
) -> None:
    jid = rig.jobs.submit(replace(job(members=2, gpus=8), max_members=3)).job.id
    rig.step()
    assert world(rig) == 2
    run_for(rig, telemetry, 200, {}, default=95.0)
    assert world(rig) == 2  # busy, but not for the whole window yet
    run_for(rig, telemetry, 120, {}, default=95.0)
    rig.step()
    assert world(rig) == 3
    (newest,) = [s.id for s in rig.jobs.elastic.slices(jid)]
    gang = rig.jobs.get(jid).workload_id
    assert gang is not None
    # The gang half busy (neither grow nor idle), the slice idle for the tenant's 600 s.
    run_for(rig, telemetry, 500, {gang: 50.0, newest: 0.0}, default=50.0)
    assert world(rig) == 3
    run_for(rig, telemetry, 120, {gang: 50.0, newest: 0.0}, default=50.0)
    rig.step()
    assert world(rig) == 2
    assert rig.jobs.elastic.slices(jid) == []


def test_no_telemetry_is_no_evidence_and_samples_read_back_as_fractions(
    rig: Rig, telemetry: Telemetry
) -> None:
    rig.jobs.submit(replace(job(members=1, gpus=8), max_members=2))
    rig.step()
    rig.advance(900)
    rig.step()
    assert world(rig) == 1  # nothing reported: it neither grows nor shrinks
    reader = rig.jobs.elastic.utilization
    assert reader is not None
    gang = rig.alloc.workloads("team-a")[0].id
    report(rig, telemetry, {}, default=90.0)
    since = rig.clock.now.replace(microsecond=0)
    (only,) = reader([gang], since)
    assert only.utilization == pytest.approx(0.9)
