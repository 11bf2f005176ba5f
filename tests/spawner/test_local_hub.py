"""End to end on the local backend: a real JupyterHub, the real portal as a hub-managed service,
``GPUSimpleLocalSpawner`` starting real (tiny) server processes."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpx
import pytest

from tests.spawner.conftest import PASSWORD, SHORT_START_S, PortalHub

pytestmark = [pytest.mark.hub, pytest.mark.slow]

A100 = {"tenant": "team-a", "option": "gpu:A100-80GB:1"}


def workloads(ph: PortalHub, state: str | None = None) -> list[dict[str, Any]]:
    query = f"?state={state}" if state else ""
    items: list[dict[str, Any]] = ph.portal(f"/workloads{query}")["items"]
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
    (allocation,) = running["allocations"]
    assert running["owner"] == "alice" and running["tenant"] == "team-a"
    # The simulated inventory names its GPUs GPU-sim-<node>-<index>; the process gets the UUID.
    assert allocation["node"] == "a100-1" and len(allocation["gpus"]) == 1
    assert env["CUDA_VISIBLE_DEVICES"] == f"GPU-sim-a100-1-{allocation['gpus'][0]}"
    assert allocation["gpu_uuids"] == [env["CUDA_VISIBLE_DEVICES"]]
    assert env["GPUPORTAL_GPUS"] == str(allocation["gpus"][0])
    assert env["GPUPORTAL_GPU_UUIDS"] == env["CUDA_VISIBLE_DEVICES"]
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
    # alice's notebook has no expected end: only its release admits anna, at no known time.
    assert queued["message"].endswith("; waits for a release; no estimate")
    (waiting,) = ph.portal("/queue?tenant=team-a")["items"]
    assert (waiting["owner"], waiting["reason"], waiting["position"]) == ("anna", "quota", 1)
    # anna's start_timeout is 5 s: waiting longer in the queue does not fail her spawn.
    time.sleep(SHORT_START_S + 2)
    assert ph.server("anna").get("pending") == "queued"

    # 3. Stopping alice's server releases her GPU; anna's spawn then starts on it.
    ph.stop("alice")
    ph.wait_ready("anna")
    env = ph.server_env("anna")
    (running,) = workloads(ph, "running")
    assert running["owner"] == "anna"
    assert env["CUDA_VISIBLE_DEVICES"] == running["allocations"][0]["gpu_uuids"][0]
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


@contextmanager
def login(ph: PortalHub, user: str) -> Iterator[httpx.Client]:
    """A client holding ``user``'s hub login cookies."""
    with httpx.Client(base_url=ph.hub.url, timeout=30) as client:
        assert client.get("/hub/login").status_code == 200
        r = client.post(
            "/hub/login",
            data={"username": user, "password": PASSWORD, "_xsrf": client.cookies["_xsrf"]},
        )
        assert r.status_code == 302, r.text
        yield client


def test_the_form_shows_availability_and_no_spawn_bypasses_its_rules(
    portal_hub: PortalHub,
) -> None:
    ph = portal_hub
    # The form, as alice's browser gets it: each option with its state.
    with login(ph, "alice") as client:
        page = client.get("/hub/spawn/alice")
    assert page.status_code == 200
    assert re.search(r"1 × A100-80GB <span[^>]*>available now", page.text)
    assert re.search(r"2 × A100-80GB NVLink <span[^>]*>not allowed</span> <small", page.text)
    assert "2 × A100-80GB NVLink needs 2 gpus of A100-80GB; team-a&#x27;s limit is 1" in page.text
    assert re.search(r"0.25 × T4 \(3 GiB\) <span[^>]*>available now", page.text)

    # REST spawns are checked like the form: refused, with why and what is valid.
    refused = {
        "tenant team-a": ({"tenant": "team-a", "option": "cpu"}, 403, "may not charge tenant"),
        "extra key": ({"option": "cpu", "image": "evil:latest"}, 400, "'image'"),
        "no quota": ({"option": "gpu:A100-80GB:1"}, 403, "team-b has no quota for A100-80GB"),
        "unknown": (
            {"option": "gpu:B200:1"},
            400,
            "expected one of share:T4:250, share:T4:500, cpu",
        ),
    }
    for what, (options, status, message) in refused.items():
        r = ph.spawn("bob", options)
        assert r.status_code == status, (what, r.text)
        assert message in r.json()["message"], (what, r.json())
    assert ph.server("bob") == {} and workloads(ph) == []

    # A half T4 share: MPS limits from the share; CPU only: no GPU visible, nothing allocated.
    assert ph.spawn("bob", {"option": "share:T4:500"}).status_code in (201, 202)
    assert ph.spawn("anna", {"option": "cpu"}).status_code in (201, 202)
    ph.wait_ready("bob")
    ph.wait_ready("anna")
    bob = ph.server_env("bob")
    assert bob["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert bob["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=7680M"
    assert (bob["GPUPORTAL_FLAVOR"], bob["GPUPORTAL_GPU_MILLI"]) == ("T4/share", "500")
    anna = ph.server_env("anna")
    assert anna["CUDA_VISIBLE_DEVICES"] == "" and anna["GPUPORTAL_OPTION"] == "cpu"
    assert [w["owner"] for w in workloads(ph)] == ["bob"]

    # bea (team-b, max_queue_wait 3 s here) queues behind bob's share and gives up, saying so.
    r = ph.spawn("bea", {"option": "share:T4:250"})
    assert r.status_code == 429, r.text
    message = r.json()["message"]
    assert message.startswith("Gave up after waiting 3 s (max_queue_wait) in team-b's queue")
    assert "Queued 1st in team-b for 0.25 × T4 (3 GiB): " in message
    assert "The request was withdrawn" in message
    assert ph.server("bea") == {} and ph.portal("/queue")["total"] == 0


def test_hub_restart_keeps_allocations_and_queue_places(portal_hub: PortalHub) -> None:
    ph = portal_hub
    assert ph.spawn("alice", A100).status_code in (201, 202)
    ph.wait_ready("alice")
    assert ph.spawn("anna", A100).status_code in (201, 202)
    ph.wait(lambda: ph.server("anna").get("pending") == "queued", "anna queued")
    before = {w["owner"]: w for w in workloads(ph)}
    assert before["anna"]["state"] == "queued"

    ph.hub.restart()  # the hub and its portal service restart; alice's server keeps running
    ph.wait(lambda: ph.server("alice").get("ready"), "alice's server after the restart")
    after = {w["owner"]: w for w in workloads(ph)}
    assert after["alice"]["id"] == before["alice"]["id"]
    assert after["alice"]["allocations"] == before["alice"]["allocations"]
    assert (after["anna"]["id"], after["anna"]["position"]) == (before["anna"]["id"], 1)

    # anna's spawn died with the hub; spawning again takes up the same queue place.
    assert ph.server("anna") == {}
    assert ph.spawn("anna", A100).status_code in (201, 202)
    ph.wait(lambda: ph.server("anna").get("pending") == "queued", "anna queued again")
    again = {w["owner"]: w for w in workloads(ph)}
    assert again["anna"]["id"] == before["anna"]["id"] and len(again) == 2
    ph.stop("alice")
    ph.wait_ready("anna")
    assert [w["owner"] for w in workloads(ph)] == ["anna"]

    # alice queues behind anna; after another restart she asks for something else: her old
    # request is withdrawn, not left in the queue, and the new one runs.
    assert ph.spawn("alice", A100).status_code in (201, 202)
    ph.wait(lambda: ph.portal("/queue")["total"] == 1, "alice queued")
    (old,) = ph.portal("/queue")["items"]
    ph.hub.restart()
    assert ph.spawn("alice", {"option": "share:T4:250"}).status_code in (201, 202)
    ph.wait_ready("alice")
    assert ph.portal(f"/workloads/{old['workload_id']}")["state"] == "cancelled"
    assert ph.portal("/queue")["total"] == 0
    assert ph.server_env("alice")["GPUPORTAL_FLAVOR"] == "T4/share"


def test_a_spawn_applies_its_options_and_the_next_form_preselects_them(
    portal_hub: PortalHub,
) -> None:
    ph = portal_hub
    with login(ph, "bob") as client:
        first = client.get("/hub/spawn/bob")
    assert first.status_code == 200
    assert re.findall(r'value="([^"]+)" checked', first.text) == ["cpu"]  # never a GPU unasked
    assert ph.spawn("bob", {"option": "share:T4:250"}).status_code in (201, 202)
    ph.wait_ready("bob")
    ph.stop("bob")
    with login(ph, "bob") as client:
        again = client.get("/hub/spawn/bob")
    assert re.findall(r'value="([^"]+)" checked', again.text) == ["share:T4:250"]
    # The spawner handled the options (apply_user_options): the hub had nothing to warn about.
    assert "unhandled user_options" not in ph.hub.log.read_text(errors="replace")
