"""Replicas on the weight cache, through the real controller, allocator and store (SQLite and
PostgreSQL), with a real HTTP server on loopback counting the bytes it serves.

STAND-IN RUNNER: ``FakeRunner`` stands for the engine processes (as in ``test_controller``);
what a replica would serve is the ``--model-dir`` of its command.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from policies.flavors import FlavorKind
from policies.requests import DeviceRequest
from policies.services import ModelRef, Replicas, ReplicaState
from portal.allocator import Allocator
from portal.inference.backend import ServiceBackend
from portal.inference.cached import FIRST, NO_ROOM, listing
from portal.inference.controller import ServiceController
from portal.inference.spec import Backend, Engine, Preset, ServiceSpec
from portal.inference.weights import WeightCache
from portal.store import services as stored
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx
from tests.portal.inference.test_weights import Served, http_model
from tests.portal.jobs.conftest import FakeRunner

H100 = "H100-80GB"
SIZE = 200_000


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    (tmp_path / "www").mkdir()
    s = Served(tmp_path / "www")
    yield s
    s.server.shutdown()
    s.server.server_close()


@pytest.fixture
def rig(db_url: str, tmp_path: Path) -> Iterator[tuple[FakeRunner, ServiceController]]:
    store = Store(db_url)
    alloc = Allocator(store, clock=ManualClock())
    alloc.start([hgx("n1"), hgx("n2")])
    for tenant in ("team-a", "team-b"):
        alloc.set_tenant(tenant, cohort="lab")
        alloc.set_quota(tenant, H100, guaranteed=8, limit=16)
    runner = FakeRunner(tmp_path)  # STAND-IN runner
    weights = WeightCache(tmp_path / "cache", node_bytes=10 * SIZE, tenant_bytes=5 * SIZE)
    backend = ServiceBackend(
        Backend.LOCAL, runner, tmp_path, probe=lambda _url: True, weights=weights
    )
    controller = ServiceController(alloc, backend=backend)
    controller.start()
    yield runner, controller
    store.close()


def spec(model: ModelRef, n: int, tenant: str = "team-a", name: str = "llm") -> ServiceSpec:
    return ServiceSpec(
        tenant=tenant,
        owner="alice",
        name=name,
        engine=Engine(preset=Preset.TEST),
        model=model,
        devices=DeviceRequest(kind=FlavorKind.GPU, count=1),
        replicas=Replicas(min=n, max=n),
    )


def model_dirs(runner: FakeRunner) -> dict[int, tuple[str, str]]:
    """Replica number -> (node, the folder its command serves)."""
    out = {}
    for (m,) in runner.launched:
        out[m.attempt] = (m.node, m.command[m.command.index("--model-dir") + 1])
    return out


def test_replicas_fetch_once_per_node_and_prefer_the_node_that_holds_the_weights(
    rig: tuple[FakeRunner, ServiceController], served: Served
) -> None:
    runner, controller = rig
    model = http_model(served, "tiny.safetensors", SIZE)
    assert controller.backend is not None and controller.backend.weights is not None
    # The weights are on n2 already (an earlier service's): placement prefers n2 over n1,
    # the first node in order, while n2 has room.
    controller.backend.weights.ensure("n2", "team-a", model, (), datetime.now(UTC))
    sid = controller.deploy(spec(model, 3)).service.id
    controller.step()
    dirs = model_dirs(runner)
    assert {node for node, _ in dirs.values()} == {"n2"} and served.bytes_sent == SIZE
    assert len({d for _, d in dirs.values()}) == 1
    # Ten replicas: n2's 8 GPUs, then n1 fetches its one copy.
    controller.scale(sid, replicas=Replicas(min=10, max=10))
    controller.step()
    dirs = model_dirs(runner)
    nodes = [node for node, _ in dirs.values()]
    assert nodes.count("n2") == 8 and nodes.count("n1") == 2
    assert served.bytes_sent == SIZE * 2  # size x distinct nodes
    started = [e.message for e in controller.events(sid) if e.kind == "service.replica_started"]
    assert sum(NO_ROOM in m for m in started) == 1 and not any(FIRST in m for m in started)
    assert sum("weights cached on" in m for m in started) == 9
    rows = listing(controller.backend, controller.store, {"team-a"})
    assert {(r.node, r.in_use) for r in rows} == {("n1", True), ("n2", True)}
    assert listing(controller.backend, controller.store, {"team-b"}) == []


def test_a_first_replica_says_so_and_a_mismatch_never_starts(
    rig: tuple[FakeRunner, ServiceController], served: Served
) -> None:
    runner, controller = rig
    model = http_model(served, "m.bin", 1000)
    sid = controller.deploy(spec(model, 1)).service.id
    controller.step()
    (started,) = [e for e in controller.events(sid) if e.kind == "service.replica_started"]
    assert FIRST in started.message and "fetched 1000 bytes" in started.message
    # Same URI, another digest: refused, nothing launched, nothing cached for it.
    wrong = ModelRef(model.uri, "sha256:" + "3" * 64)
    bad = controller.deploy(spec(wrong, 1, tenant="team-b", name="bad")).service.id
    controller.step()
    r = stored.replicas(controller.store, bad)[0]  # (a replacement is already queued)
    assert r.state is ReplicaState.ENDED and "weights refused" in r.reason
    assert "model.digest" in r.reason and model.digest in r.reason
    assert len(runner.launched) == 1
    assert listing(controller.backend, controller.store, {"team-b"}) == []
