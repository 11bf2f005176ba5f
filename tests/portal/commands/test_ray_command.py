"""``gpuportal ray up --idle-s`` and ``gpuportal ray resume`` against a live portal (no Ray
process: the controller without a backend holds and releases the slices)."""

from __future__ import annotations

import json

from portal.ray.controller import RayController
from tests.portal.client.conftest import Served
from tests.portal.commands.conftest import Gpuportal


def test_up_with_an_idle_time_then_resume_after_an_idle_release(
    gpuportal: Gpuportal, portal_server: Served
) -> None:
    ran = gpuportal(
        "ray", "up", "team-a", "H100-80GB", "--workers", "2", "--idle-s", "30", "--no-wait",
        "--json", token="alice",
    )  # fmt: skip
    assert ran.code == 0, ran.err
    made = json.loads(ran.out)
    assert (made["spec"]["idle_s"], made["spec"]["idle_suspend"]) == (30.0, False)
    cid = made["id"]

    # Not idle: refused (409: exit 2) with the reason, nothing requested.
    ran = gpuportal("ray", "resume", cid, "--no-wait", token="alice")
    assert ran.code == 2 and "only an idle or suspended cluster" in ran.err, ran.err
    assert len(portal_server.allocator.workloads("team-a")) == 1

    RayController(portal_server.allocator).release_idle(cid, 30.0)
    assert portal_server.allocator.workloads() == []
    ran = gpuportal("ray", "resume", cid, "--no-wait", "--json", token="alice")
    assert ran.code == 0, ran.err
    back = json.loads(ran.out)
    assert [(s["number"], s["state"]) for s in back["slices"]] == [(1, "released"), (2, "running")]
    assert len(portal_server.allocator.workloads("team-a")) == 1
