"""The queue's ETA interval and reason through the API, on SQLite and PostgreSQL."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from portal.allocator import Allocator
from tests.portal.allocator.conftest import gpus, wl
from tests.portal.api.conftest import auth


@pytest.fixture
def store_url(db_url: str) -> str:
    return db_url


def _queue(client: TestClient) -> list[dict[str, object]]:
    r = client.get("/api/v1/queue", headers=auth("root"))
    assert r.status_code == 200, r.text
    items: list[dict[str, object]] = r.json()["items"]
    return items


def test_a_wait_behind_a_time_limit_has_its_interval_and_reason(
    allocator: Allocator, client: TestClient
) -> None:
    allocator.request(wl("team-b", gpus(4), name="long"), expected_duration_s=720.0)
    allocator.request(wl("team-a", gpus(2), name="open"))  # no declared end
    queued = allocator.request(wl("team-b", gpus(2), name="next"))
    (entry,) = [e for e in _queue(client) if e["workload_id"] == queued.id]
    assert entry["eta_s"] == 720.0
    assert entry["eta_low_s"] == 720.0 and entry["eta_high_s"] == 720.0
    assert entry["eta_reason"] == (
        "nothing ahead of you; the next H100-80GB frees in about 12 min when a job reaches "
        "its time limit"
    )


def test_a_wait_only_an_unforeseen_release_ends_has_no_interval(
    allocator: Allocator, client: TestClient
) -> None:
    allocator.request(wl("team-b", gpus(4), name="a"))
    allocator.request(wl("team-a", gpus(2), name="b"))
    queued = allocator.request(wl("team-a", gpus(1), name="c"))
    (entry,) = [e for e in _queue(client) if e["workload_id"] == queued.id]
    assert entry["eta_s"] is None and entry["eta_low_s"] is None and entry["eta_high_s"] is None
    assert str(entry["eta_reason"]).startswith("waits for a release")


def test_a_queued_workloads_status_has_the_same_interval_and_reason(
    allocator: Allocator, client: TestClient
) -> None:
    allocator.request(wl("team-b", gpus(4), name="long"), expected_duration_s=720.0)
    allocator.request(wl("team-a", gpus(2), name="open"))
    queued = allocator.request(wl("team-b", gpus(2), name="next"))
    r = client.get(f"/api/v1/workloads/{queued.id}", headers=auth("root"))
    assert r.status_code == 200, r.text
    got = r.json()
    (entry,) = [e for e in _queue(client) if e["workload_id"] == queued.id]
    for field in ("eta_s", "eta_low_s", "eta_high_s", "eta_reason"):
        assert got[field] == entry[field], field
    assert got["eta_reason"].startswith("nothing ahead of you; the next H100-80GB frees")
