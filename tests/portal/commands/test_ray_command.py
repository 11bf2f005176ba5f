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


def test_submit_a_one_off_job_list_it_and_stop_it_giving_the_quota_back(
    gpuportal: Gpuportal, portal_server: Served
) -> None:
    ran = gpuportal(
        "ray", "submit", "python job.py", "--tenant", "team-a", "--flavor", "H100-80GB",
        "--env", "EPOCHS=3", "--metadata", "run=7", "--no-wait", "--json", token="alice",
    )  # fmt: skip
    assert ran.code == 0, ran.err
    job = json.loads(ran.out)
    assert (job["state"], job["one_off"], job["entrypoint"]) == ("queued", True, "python job.py")
    assert (job["runtime_env"], job["metadata"]) == ({"env_vars": {"EPOCHS": "3"}}, {"run": "7"})
    [held] = portal_server.allocator.workloads("team-a")
    assert held.kind == "ray"

    ran = gpuportal("ray", "jobs", "--json", token="alice")
    assert [j["id"] for j in json.loads(ran.out)] == [job["id"]]
    # Another tenant's member can neither see nor stop it (403: exit 2).
    assert json.loads(gpuportal("ray", "jobs", "--json", token="bob").out) == []
    ran = gpuportal("ray", "stop", job["id"], token="bob")
    assert ran.code == 2, ran.err
    assert len(portal_server.allocator.workloads("team-a")) == 1

    ran = gpuportal("ray", "stop", job["id"], "--json", token="alice")
    assert (ran.code, json.loads(ran.out)["state"]) == (0, "cancelled"), ran.err
    assert portal_server.allocator.workloads() == []


def test_submit_refuses_bad_input_naming_it_and_creates_nothing(
    gpuportal: Gpuportal, portal_server: Served
) -> None:
    for args, named in [
        (("--tenant", "team-a", "--flavor", "H100-80GB", "--env", "NOEQUALS"), "--env"),
        (("--flavor", "H100-80GB"), "tenant"),
        (
            ("--tenant", "team-a", "--flavor", "H100-80GB", "--working-dir", "/no/such"),
            "working_dir",
        ),
    ]:
        ran = gpuportal("ray", "submit", "python job.py", *args, "--no-wait", token="alice")
        assert ran.code == 2 and named in ran.err, (args, ran.err)
    assert json.loads(gpuportal("ray", "jobs", "--json", token="alice").out) == []
    assert portal_server.allocator.workloads() == []
