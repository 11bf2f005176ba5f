"""``gpuportal jobs`` against a live portal whose job controller runs in a background loop
(stand-in runner: see ``tests/portal/jobs/conftest.py``), with the user's own token."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.applications import Starlette
from starlette.routing import Mount

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.jobs.controller import JobController
from tests.portal.api.conftest import TOKENS
from tests.portal.client.conftest import PREFIX, Served, serving
from tests.portal.client.test_jobs import until
from tests.portal.commands.conftest import Gpuportal
from tests.portal.jobs.conftest import FakeRunner, make_backend


@pytest.fixture
def runner(tmp_path: Path) -> FakeRunner:
    return FakeRunner(tmp_path)  # STAND-IN runner


@pytest.fixture
def portal_server(allocator: Allocator, runner: FakeRunner) -> Iterator[Served]:
    controller = JobController(allocator, backend=make_backend(runner))
    controller.start()
    app = create_app(allocator, StaticAuthenticator(TOKENS), job_controller=controller)
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(0.02):
            allocator.tick()
            controller.step()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        with serving(Starlette(routes=[Mount(PREFIX, app=app)])) as port:
            yield Served(allocator, f"http://127.0.0.1:{port}", port)
    finally:
        stop.set()
        thread.join(5)


def test_submit_list_logs_attempts_and_cancel(gpuportal: Gpuportal, runner: FakeRunner) -> None:
    ran = gpuportal(
        "jobs",
        "submit",
        "team-a",
        "H100-80GB",
        "--members",
        "2",
        "--env",
        "EPOCHS=3",
        "--json",
        "--",
        "python",
        "train.py",
        "--lr",
        "0.1",
        token="alice",
    )
    assert ran.code == 0, ran.err
    job = json.loads(ran.out)
    assert job["spec"]["command"] == ["python", "train.py", "--lr", "0.1"]
    assert job["spec"]["env"] == {"EPOCHS": "3"}
    jid = job["id"]
    until(lambda: bool(runner.launched))
    log = runner.log_path(jid, 1, 0)
    log.parent.mkdir(parents=True)
    log.write_text("step 1 loss 0.5\n")
    listed = gpuportal("jobs", token="alice")
    assert jid in listed.out and "running" in listed.out
    assert gpuportal("jobs", token="bob").out.strip() == "(none)"
    assert gpuportal("jobs", "logs", jid, token="alice").out == "step 1 loss 0.5\n"
    shown = gpuportal("jobs", "attempts", jid, token="alice")
    assert shown.code == 0 and "n1" in shown.out
    # Another tenant's token: refused, nothing changed.
    for action in ("show", "cancel", "logs", "attempts", "cost"):
        refused = gpuportal("jobs", action, jid, token="bob")
        assert refused.code != 0, refused
        assert re.search(r"user bob (may not use|is not a member of tenant team-a)", refused.err)
    # No prices configured here: the GPU-hours count, the money is 0 and says why.
    priced = gpuportal("jobs", "cost", jid, token="alice")
    assert priced.code == 0, priced.err
    assert re.search(r"^1 +running .* 0\.00 USD$", priced.out, re.M), priced.out
    assert "no price configured for H100-80GB" in priced.out
    cost = json.loads(gpuportal("jobs", "cost", jid, "--json", token="alice").out)
    assert [a["number"] for a in cost["attempts"]] == [1] and cost["gpu_hours"] > 0
    cancelled = gpuportal("jobs", "cancel", jid, "--json", token="alice")
    assert json.loads(cancelled.out)["state"] == "cancelled"
    attempts = json.loads(gpuportal("jobs", "attempts", jid, "--json", token="alice").out)
    assert [a["exit_reason"] for a in attempts] == ["cancelled"]


def test_bad_input_names_the_field(gpuportal: Gpuportal) -> None:
    ran = gpuportal(
        "jobs", "submit", "team-a", "H100-80GB", "--members", "0", "--", "x", token="alice"
    )
    assert ran.code == 2
    assert "members" in ran.err
    assert gpuportal("jobs", "--json", token="alice").out.strip() == "[]"


def test_an_elastic_job_shows_members_now_and_its_bound(gpuportal: Gpuportal) -> None:
    args = ("jobs", "submit", "team-a", "H100-80GB", "--members", "1", "--max-members")
    bad = gpuportal(*args, "0", "--", "x", token="alice")
    assert bad.code == 2 and "members.max 0" in bad.err, bad.err
    ran = gpuportal(*args, "2", "--json", "--", "python", "train.py", token="alice")
    assert ran.code == 0, ran.err
    jid = json.loads(ran.out)["id"]
    shown = gpuportal("jobs", "show", jid, token="alice")
    assert re.search(r"^members +1 \(1-2\)$", shown.out, re.M), shown.out
    assert "WORLD" in gpuportal("jobs", "attempts", jid, token="alice").out
