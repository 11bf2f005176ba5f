"""``gpu_utilization`` as a scaling metric: real sample batches for the replicas' devices go
through the telemetry's ingest and attribution (the NVML agent's boundary: no GPU here) into
the store, and the autoscaler reads them back, over a real allocator and store.

STAND-IN RUNNER, PROBE and CALLS as in ``test_warm_pool``: the engines are not started; the
clock is manual so that the windows are driven step by step.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.requests import DeviceRequest
from policies.services import ModelRef, Replicas, ReplicaState, ScalingMetric, ScalingRule
from portal.allocator import Allocator
from portal.inference.autoscaler import Autoscaler
from portal.inference.controller import ServiceController
from portal.inference.spec import Engine, Preset, ServiceSpec
from portal.store import services as stored
from portal.store.writer import Store
from portal.telemetry.service import Telemetry
from portal.telemetry.wire import SampleBatch
from tests.portal.allocator.conftest import ManualClock, hgx
from tests.portal.inference.test_warm_pool import Calls, backend
from tests.portal.jobs.conftest import FakeRunner

H100 = "H100-80GB"
SAMPLE_EVERY_S = 10.0  # the node agent's default interval


@dataclass
class Rig:
    alloc: Allocator
    clock: ManualClock
    controller: ServiceController
    autoscaler: Autoscaler
    telemetry: Telemetry


@pytest.fixture
def rig(db_url: str, tmp_path: Path) -> Iterator[Rig]:
    store = Store(db_url)
    clock = ManualClock()
    alloc = Allocator(store, clock=clock)
    alloc.start([hgx("n1")])
    alloc.set_tenant("team-a")
    alloc.set_quota("team-a", H100, guaranteed=8, limit=8)
    controller = ServiceController(alloc, backend=backend(FakeRunner(tmp_path), Calls(), tmp_path))
    controller.start()
    telemetry = Telemetry(alloc, clock=lambda: clock.now.timestamp(), attribution_ttl_s=0)
    yield Rig(alloc, clock, controller, Autoscaler(controller), telemetry)
    store.close()


def deploy(rig: Rig) -> str:
    spec = ServiceSpec(
        tenant="team-a",
        owner="alice",
        name="llm",
        engine=Engine(preset=Preset.TEST),
        model=ModelRef("file:///models/tiny", "sha256:" + "0" * 64),
        devices=DeviceRequest(kind=FlavorKind.GPU, count=1),
        replicas=Replicas(min=1, max=4, warm=1),
        scaling=ScalingRule(
            metric=ScalingMetric.GPU_UTILIZATION, target=60.0, up_window_s=5, down_window_s=30
        ),
    )
    sid = rig.controller.deploy(spec).service.id
    rig.controller.step()
    return sid


def report(rig: Rig, sid: str, serving_pct: float | None) -> None:
    """One sample per GPU of each live replica, stamped now: the serving ones at
    ``serving_pct`` (None: not measured), the warm ones (asleep) at 0 %."""
    at = rig.clock.now.timestamp()
    per_node: dict[str, list[dict[str, object]]] = defaultdict(list)
    for r in stored.replicas(rig.alloc.store, sid, live=True):
        if r.state not in (ReplicaState.READY, ReplicaState.ASLEEP):
            continue
        pct = 0.0 if r.pooled else serving_pct
        for a in rig.alloc.status(r.workload_id, estimate=False).allocations:
            for gpu in a.gpu_uuids:
                per_node[a.node].append(
                    {
                        "gpu_uuid": gpu,
                        "at": at,
                        "utilization_pct": pct,
                        "memory_used_mib": 1000.0,
                        "memory_total_mib": 81920.0,
                    }
                )
    for node, samples in per_node.items():
        batch = SampleBatch.model_validate({"node": node, "source": "nvml", "samples": samples})
        assert rig.telemetry.ingest(batch).accepted == len(samples)


def run_for(rig: Rig, sid: str, seconds: float, serving_pct: float | None) -> list[int]:
    """A sample every ``SAMPLE_EVERY_S``, the autoscaler every second: the desired counts."""
    desired = []
    for k in range(int(seconds)):
        if k % SAMPLE_EVERY_S == 0:
            report(rig, sid, serving_pct)
        rig.autoscaler.evaluate()
        rig.controller.step()
        desired.append(rig.controller.get(sid).desired)
        rig.clock.advance(seconds=1)
    return desired


def test_gpu_utilization_scales_on_the_serving_replicas_samples_and_not_on_missing_ones(
    rig: Rig,
) -> None:
    sid = deploy(rig)
    reps = stored.replicas(rig.alloc.store, sid, live=True)
    assert {(r.state, r.pooled) for r in reps} == {
        (ReplicaState.READY, False),
        (ReplicaState.ASLEEP, True),
    }
    # 40 % on the serving replica: below the target 60, but not for a whole down window yet.
    assert set(run_for(rig, sid, 20, 40.0)) == {1}
    # 90 %: above the target for the up window -> ceil(90 x 1 / 60) = 2. The asleep warm
    # replica's 0 % is not averaged in (it would make (90 + 0) / 2 = 45, below the target).
    assert set(run_for(rig, sid, 10, 90.0)) == {2}
    events = [e.message for e in rig.controller.events(sid) if e.kind == "service.scaled_up"]
    assert events and "gpu_utilization 90.00 per replica: 1 -> 2" in events[-1]
    # Samples that did not measure utilization: no evidence, so no decision, for far longer
    # than the down window.
    assert set(run_for(rig, sid, 40, None)) == {2}
    # Measured again, low on both serving replicas for a whole down window: down to the
    # max(10) x 2 / 60 -> 1 replica.
    desired = run_for(rig, sid, 40, 10.0)
    assert desired[-1] == 1
