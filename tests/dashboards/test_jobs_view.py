"""My work's Jobs section and Launch form against a real portal API with a job controller
(stand-in runner at the process boundary: ``tests/portal/jobs/conftest.py``), stepped by the
test so every state is reached on purpose."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest

from dashboards.app import build_view
from dashboards.jobs_view import JobsView, cost_line, job_row
from dashboards.stores import JobsStore
from policies.jobs import JobState
from portal.allocator import Allocator
from portal.client import Portal as Client
from portal.jobs.controller import JobController
from portal.waits import NO_ESTIMATE
from tests.dashboards.conftest import Portal, running_portal
from tests.dashboards.seed import VIEWERS
from tests.dashboards.test_scoping import rendered
from tests.portal.jobs.conftest import FakeRunner, make_backend


class Jobs:
    """The portal, its controller and the stand-in runner whose members the test ends."""

    def __init__(self, portal: Portal, runner: FakeRunner) -> None:
        self.portal = portal
        self.runner = runner
        assert portal.jobs is not None
        self.controller: JobController = portal.jobs

    def step(self) -> None:
        self.portal.allocator.tick()
        self.controller.step()

    def client(self, token: str) -> Client:
        return Client(self.portal.url, token)

    def store(self, token: str, owner: str) -> JobsStore:
        store = JobsStore(self.portal.source(token), owner=owner)
        store.refresh()
        assert store.error == ""
        return store

    def write_log(self, job_id: str, attempt: int, text: str) -> None:
        path = self.runner.log_path(job_id, attempt, 0)
        path.parent.mkdir(parents=True, exist_ok=True)
        with path.open("a") as f:
            f.write(text)

    def log_reads(self, token: str, count: int) -> list[str]:
        """The query strings of ``token``'s log reads, once ``count`` are recorded (2 s)."""
        deadline = time.monotonic() + 2
        while True:
            seen = [e.query for e in self.portal.seen(token) if e.path.endswith("/logs")]
            if len(seen) >= count or time.monotonic() > deadline:
                return seen
            time.sleep(0.02)

    def posts(self, token: str, expected: list[str]) -> list[str]:
        """The paths ``token`` posted to; waits up to 2 s for ``expected``, as the recorder
        notes an exchange just after its answer was sent."""
        deadline = time.monotonic() + 2
        while True:
            seen = [e.path for e in self.portal.seen(token) if e.method == "POST"]
            if seen == expected or time.monotonic() > deadline:
                return seen
            time.sleep(0.02)


@pytest.fixture
def jobs(tmp_path: Path) -> Iterator[Jobs]:
    runner = FakeRunner(tmp_path)  # STAND-IN runner: no processes, no GPUs here

    def controller(alloc: Allocator) -> JobController:
        return JobController(alloc, backend=make_backend(runner))

    with running_portal(tmp_path, controller) as portal:
        yield Jobs(portal, runner)


def test_lists_only_the_viewers_jobs_with_members_attempt_and_queue_wait(jobs: Jobs) -> None:
    with jobs.client("tok-alice") as alice, jobs.client("tok-bob") as bob:
        fits = alice.jobs.submit("team-a", ["python", "a.py"], members=2, flavor="H100-80GB")
        # team-a holds 5 of its limit 8 H100s: 2 × 4 more must wait for quota.
        waits = alice.jobs.submit(
            "team-a", ["python", "b.py"], members=2, flavor="H100-80GB", count=4
        )
        theirs = bob.jobs.submit("team-b", ["python", "c.py"], flavor="H100-80GB")
    jobs.step()
    store = jobs.store("tok-alice", "alice")
    assert [j.id for j in store.jobs] == [fits.id, waits.id]
    rows = {r[1]: r for r in map(job_row, store.jobs)}
    assert rows[fits.id][3:7] == ("running", "2 × 1 H100-80GB", "1", "0 / 0")
    assert "hgx-" in rows[fits.id][7]  # its devices
    queued = rows[waits.id]
    assert queued[3:5] == ("queued", "2 × 4 H100-80GB")
    assert queued[7].startswith("#") and "quota: " in queued[7]
    assert "unknown" not in queued[7] and (NO_ESTIMATE in queued[7] or "wait" in queued[7])
    # Isolation: bob sees his job only, though the portal holds alice's too.
    assert [j.id for j in jobs.store("tok-bob", "bob").jobs] == [theirs.id]
    # A teammate (mia, team-a) reads team-a's jobs but My work lists her own: none.
    assert jobs.store("tok-mia", "mia").jobs == []


def test_a_waiting_job_shows_its_wait_interval_and_why(jobs: Jobs) -> None:
    with jobs.client("tok-alice") as alice:
        alice.jobs.submit(
            "team-a", ["python", "a.py"], members=3, flavor="H100-80GB", expected_duration_s=720
        )
        waits = alice.jobs.submit("team-a", ["python", "b.py"], members=3, flavor="H100-80GB")
    jobs.step()
    (job,) = [j for j in jobs.store("tok-alice", "alice").jobs if j.id == waits.id]
    line = job_row(job)[7]
    assert job.workload is not None and job.workload.eta_reason
    # team-a's limit frees when the first job reaches its declared 12 minutes.
    assert "estimated wait 12 min" in line
    assert "frees in about 12 min when a job reaches its time limit" in line


def test_a_share_job_says_its_share_per_member(jobs: Jobs) -> None:
    with jobs.client("tok-alice") as alice:
        alice.jobs.submit("team-a", ["python", "s.py"], members=2, flavor="T4/share", milli=250)
    (row,) = map(job_row, jobs.store("tok-alice", "alice").jobs)
    assert row[4] == "2 × 250 milli T4"


def test_attempt_history_and_rank_0_log_read_by_offset_across_a_restart(jobs: Jobs) -> None:
    with jobs.client("tok-alice") as alice:
        job = alice.jobs.submit(
            "team-a", ["python", "train.py"], members=2, flavor="H100-80GB", backoff_s=0
        )
    jobs.step()
    jobs.write_log(job.id, 1, "step 1\n")
    store = jobs.store("tok-alice", "alice")
    assert store.selected == job.id
    assert (store.log_tail, store.log_attempt, store.log_offset) == ("step 1\n", 1, 7)
    jobs.write_log(job.id, 1, "step 2\n")
    store.refresh()
    assert store.log_tail == "step 1\nstep 2\n"
    log_reads = jobs.log_reads("tok-alice", 2)
    assert ["offset=0" in q for q in log_reads] == [True, False]
    assert "offset=7" in log_reads[1]  # only what was written since, not the whole file
    jobs.runner.exit(job.id, 1, 1, 137)
    jobs.step()  # attempt 1 ends: exit code 137; no backoff: attempt 2 is queued
    jobs.step()  # and runs
    store.refresh()
    assert store.job() is not None and store.job().attempt == 2  # type: ignore[union-attr]
    first, second = store.attempts
    assert (first.number, first.exit_reason, first.counted) == (1, "exit code 137", True)
    assert first.nodes and first.started_at is not None and first.ended_at is not None
    assert first.queue_wait_s is not None
    assert second.number == 2 and second.ended_at is None
    # The view's table says the same in words.
    rows = JobsView(store).attempt_table()
    assert "exit code 137" in rows and first.nodes[0] in rows
    assert (store.log_tail, store.log_attempt) == ("", 2)  # the new attempt's log, from 0
    jobs.write_log(job.id, 2, "resumed\n")
    store.refresh()
    assert store.log_tail == "resumed\n"


def test_the_selected_job_shows_what_it_cost_in_all_and_per_attempt(jobs: Jobs) -> None:
    with jobs.client("tok-alice") as alice:
        job = alice.jobs.submit("team-a", ["python", "t.py"], members=2, flavor="H100-80GB")
    jobs.step()
    jobs.portal.clock.now += timedelta(minutes=30)  # 2 H100s for half an hour at 4.00
    store = jobs.store("tok-alice", "alice")
    assert store.cost is not None and store.cost.job_id == job.id
    assert cost_line(store.cost) == "**Cost so far:** 4.00 USD for 1.00 GPU-hours"
    assert "4.00 USD" in JobsView(store).attempt_table()
    jobs.portal.clock.now += timedelta(minutes=30)
    store.refresh()
    assert [(a.number, a.cost) for a in store.cost.attempts] == [(1, "8.00")]


def test_cancel_stops_the_selected_job_and_disables_the_button(jobs: Jobs) -> None:
    with jobs.client("tok-alice") as alice:
        job = alice.jobs.submit("team-a", ["sleep", "600"], flavor="H100-80GB")
    jobs.step()
    store = jobs.store("tok-alice", "alice")
    view = JobsView(store)
    assert not view.cancel_button.disabled
    assert store.cancel()
    assert jobs.controller.get(job.id).state is JobState.CANCELLED
    assert store.jobs[0].state is JobState.CANCELLED
    assert store.message.endswith("cancelled")
    assert view.cancel_button.disabled


def test_launch_form_submits_the_split_command_and_its_settings(jobs: Jobs) -> None:
    store = jobs.store("tok-alice", "alice")
    view = JobsView(store)
    assert view.tenant.options == ["team-a"]
    # team-a's quotas: H100-80GB and T4/share; a share needs milli the form does not ask.
    assert view.flavor.options == ["H100-80GB"]
    view.tenant.value = "team-a"
    view.flavor.value = "H100-80GB"
    view.members.value = 2
    view.count.value = 1
    view.command.value = "python train.py --name 'run one'"
    view.cwd.value = "/work/run"
    view.checkpoint_dir.value = "/data/ckpt/run1"
    view.level.value = "same-node"
    view.mode.value = "preferred"
    view.max_restarts.value = 5
    made = view.launch()
    assert made is not None and store.form_error == ""
    spec = jobs.controller.get(made.id).spec
    assert spec["command"] == ["python", "train.py", "--name", "run one"]
    assert (spec["cwd"], spec["checkpoint_dir"], spec["members"]) == (
        "/work/run",
        "/data/ckpt/run1",
        2,
    )
    assert spec["restart"] == {**made.spec["restart"], "max_restarts": 5}
    assert spec["topology_mode"] == "preferred"
    assert store.selected == made.id and [j.id for j in store.jobs] == [made.id]


@pytest.mark.parametrize(
    ("field", "value", "said"),
    [
        ("members", 0, "members: "),
        ("cwd", "relative/dir", "cwd: "),
        ("count", 0, "devices.count: "),
    ],
)
def test_a_refused_launch_shows_the_portals_field_and_message_and_creates_nothing(
    jobs: Jobs, field: str, value: object, said: str
) -> None:
    store = jobs.store("tok-alice", "alice")
    view = JobsView(store)
    view.tenant.value, view.flavor.value = "team-a", "H100-80GB"
    view.command.value = "python train.py"
    getattr(view, field).value = value
    assert view.launch() is None
    assert store.form_error.startswith(f"not launched: {said}")
    assert jobs.posts("tok-alice", ["/api/v1/jobs"]) == ["/api/v1/jobs"]  # sent once, refused
    assert jobs.controller.jobs() == [] and store.jobs == []


def test_a_command_that_does_not_split_is_refused_before_anything_is_sent(jobs: Jobs) -> None:
    store = jobs.store("tok-alice", "alice")
    view = JobsView(store)
    view.tenant.value, view.flavor.value = "team-a", "H100-80GB"
    view.command.value = "python train.py --name 'run one"
    assert view.launch() is None
    assert store.form_error.startswith("not launched: command: No closing quotation")
    assert jobs.posts("tok-alice", []) == []


def test_my_work_page_offers_the_tenants_the_viewer_may_start_work_in(jobs: Jobs) -> None:
    with jobs.client("tok-alice") as alice:
        job = alice.jobs.submit("team-a", ["python", "a.py"], flavor="H100-80GB")
    jobs.step()
    jobs.write_log(job.id, 1, "loss <0.5> at step 3\n")
    for token, tenants, listed in (
        ("tok-alice", ["team-a"], [job.id]),
        ("tok-lead", [], []),  # leadership reads every tenant, starts work in none
    ):
        viewer = VIEWERS[token]
        page = build_view("my_work", jobs.portal.source(token), viewer, {})
        (store,) = (s for s in page.stores if isinstance(s, JobsStore))
        assert store.error == "" and store.tenants == tenants
        assert [j.id for j in store.jobs] == listed
        text = rendered(page.view)
        assert "Launch a job" in text
        # The log tail, escaped once by the view (the pane's text escapes it again), on the
        # page of the job's owner only.
        assert ("loss &amp;lt;0.5&amp;gt; at step 3" in text) is (token == "tok-alice")


def test_a_refused_jobs_read_says_why_in_the_section(jobs: Jobs) -> None:
    ops = VIEWERS["tok-ops"]  # inventory only: My work opened by its address
    page = build_view("my_work", jobs.portal.source("tok-ops"), ops, {})
    (store,) = (s for s in page.stores if isinstance(s, JobsStore))
    assert store.error.startswith("your roles do not let you read workloads")
    text = rendered(page.view)
    assert "Could not read jobs from the portal:" in text and store.error in text
