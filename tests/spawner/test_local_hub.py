"""End to end on the local backend: a real JupyterHub, the real portal as a hub-managed service,
``GPUSimpleLocalSpawner`` starting real (tiny) server processes."""

from __future__ import annotations

import pytest

from tests.spawner.conftest import PortalHub

pytestmark = [pytest.mark.hub, pytest.mark.slow]

A100 = {"tenant": "team-a", "option": "gpu:A100-80GB:1"}


def workloads(ph: PortalHub, state: str | None = None) -> list[dict[str, object]]:
    query = f"?state={state}" if state else ""
    items: list[dict[str, object]] = ph.portal(f"/workloads{query}")["items"]
    return items


def test_spawn_is_pinned_queues_with_progress_and_starts_when_the_first_stops(
    portal_hub: PortalHub,
) -> None:
    ph = portal_hub
    # 1. alice gets one A100, and her server's environment names it.
    r = ph.spawn("alice", A100)
    assert r.status_code in (201, 202), r.text
    ph.wait_ready("alice")
    env = ph.server_env("alice")
    (running,) = workloads(ph, "running")
    (allocation,) = running["allocations"]  # type: ignore[misc]
    assert running["owner"] == "alice" and running["tenant"] == "team-a"
    # The simulated inventory has no UUIDs: the process sees the GPU by its index.
    assert allocation["node"] == "a100-1" and len(allocation["gpus"]) == 1
    assert env["CUDA_VISIBLE_DEVICES"] == str(allocation["gpus"][0])
    assert env["GPUPORTAL_GPUS"] == env["CUDA_VISIBLE_DEVICES"]
    assert env["GPUPORTAL_WORKLOAD_ID"] == running["id"]
    assert (env["GPUPORTAL_TENANT"], env["GPUPORTAL_FLAVOR"]) == ("team-a", "A100-80GB")
    assert env["GPUPORTAL_OPTION_LABEL"] == "1 × A100-80GB"
    alice_first = running["id"]

    # 2. anna, same tenant, waits: the quota is used; the spawn page says where and why.
    r = ph.spawn("anna", A100)
    assert r.status_code in (201, 202), r.text
    assert ph.wait(lambda: ph.server("anna").get("pending") == "queued", "anna queued")
    with ph.progress("anna") as events:
        queued = next(e for e in events if "Queued" in e.get("message", ""))
    assert queued["message"].startswith("Queued 1st in team-a for 1 × A100-80GB: ")
    assert "team-a quota for A100-80GB: 1/1 gpus in use" in queued["message"]
    assert "estimated wait" in queued["message"]
    (waiting,) = ph.portal("/queue?tenant=team-a")["items"]
    assert (waiting["owner"], waiting["reason"], waiting["position"]) == ("anna", "quota", 1)

    # 3. Stopping alice's server releases her GPU; anna's spawn then starts on it.
    ph.stop("alice")
    ph.wait_ready("anna")
    env = ph.server_env("anna")
    (running,) = workloads(ph, "running")
    assert running["owner"] == "anna"
    assert env["CUDA_VISIBLE_DEVICES"] == str(running["allocations"][0]["gpus"][0])  # type: ignore[index]
    assert ph.portal(f"/workloads/{alice_first}")["state"] == "released"

    # 4. alice queues behind anna, then cancels: her queue entry is gone.
    assert ph.spawn("alice", A100).status_code in (201, 202)
    ph.wait(lambda: ph.portal("/queue")["total"] == 1, "alice queued")
    ph.stop("alice")
    assert ph.portal("/queue")["total"] == 0
    assert [w["owner"] for w in workloads(ph)] == ["anna"]

    # 5. anna's stop releases exactly her allocation, once; nothing is left held.
    ph.stop("anna")
    assert workloads(ph) == []
