"""``/inventory/changes``: list the nodes once, then read only what changed since."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi.testclient import TestClient

from portal.allocator import Allocator
from portal.api import create_app
from portal.api.auth import StaticAuthenticator
from portal.store.writer import Store
from tests.portal.allocator.conftest import ManualClock, hgx
from tests.portal.api.conftest import TOKENS, auth, gpu_request

CHANGES = "/api/v1/inventory/changes"


def listed_version(client: TestClient) -> str:
    r = client.get("/api/v1/nodes", params={"topology": "false"}, headers=auth("root"))
    assert r.status_code == 200, r.text
    version: str = r.headers["Inventory-Version"]
    assert version
    return version


def changes(client: TestClient, since: str, **params: str) -> dict[str, Any]:
    r = client.get(CHANGES, params={"since": since, **params}, headers=auth("root"))
    assert r.status_code == 200, r.text
    body: dict[str, Any] = r.json()
    return body


def test_nothing_changed_answers_no_nodes_and_the_same_version(client: TestClient) -> None:
    version = listed_version(client)
    assert changes(client, version) == {"version": version, "nodes": [], "removed": []}


def test_an_allocation_and_its_release_show_the_node_with_its_new_free_share(
    client: TestClient, allocator: Allocator, tmp_path: Path
) -> None:
    allocator.node_added(hgx("n2"))
    version = listed_version(client)
    made = client.post("/api/v1/workloads", json=gpu_request(n=2), headers=auth("alice"))
    assert made.status_code == 201, made.text
    (held,) = {a["node"] for a in made.json()["allocations"]}

    after = changes(client, version, topology="false")
    assert after["removed"] == []
    (node,) = after["nodes"]
    assert node["name"] == held
    assert sorted(g["free_milli"] for g in node["gpus"]) == [0, 0] + [1000] * 6
    assert node["links"] is None  # topology=false, as on /nodes
    assert after["version"] != version

    # From the new version on: nothing, until the release.
    assert changes(client, str(after["version"]))["nodes"] == []
    released = client.delete(f"/api/v1/workloads/{made.json()['id']}", headers=auth("alice"))
    assert released.status_code == 200, released.text
    again = changes(client, str(after["version"]))
    (node,) = again["nodes"]
    assert node["name"] == held
    assert [g["free_milli"] for g in node["gpus"]] == [1000] * 8
    assert node["links"] is not None  # topology read by default


def test_removed_and_added_nodes_are_named(client: TestClient, allocator: Allocator) -> None:
    allocator.node_added(hgx("n2"))
    version = listed_version(client)
    allocator.node_removed("n2")
    allocator.node_added(hgx("n3"))
    after = changes(client, version)
    assert after["removed"] == ["n2"]
    assert [n["name"] for n in after["nodes"]] == ["n3"]


def test_a_version_of_another_portal_start_is_expired_and_changes_nothing(
    tmp_path: Path, client: TestClient
) -> None:
    old = listed_version(client)
    store = Store(f"sqlite:///{tmp_path / 'other.db'}")
    other = Allocator(store, clock=ManualClock())
    other.start([hgx("n1")])
    try:
        with TestClient(create_app(other, StaticAuthenticator(TOKENS))) as restarted:
            r = restarted.get(CHANGES, params={"since": old}, headers=auth("root"))
            assert r.status_code == 410, r.text
            assert r.json()["code"] == "expired"
            assert "list /nodes again" in r.json()["message"]
            fresh = listed_version(restarted)
            assert changes(restarted, fresh)["nodes"] == []
    finally:
        store.close()


def test_malformed_or_future_versions_are_refused_with_what_is_valid(
    client: TestClient,
) -> None:
    version = listed_version(client)
    epoch, _, seq = version.partition(".")
    for bad in ("", "nonsense", f"{epoch}.", f"{epoch}.-1", f"{epoch}.{int(seq) + 5}"):
        r = client.get(CHANGES, params={"since": bad}, headers=auth("root"))
        assert r.status_code == 422, (bad, r.text)
        assert r.json()["field"] in ("since", "query since"), r.text
    # Still answers for the real version afterwards.
    assert changes(client, version)["version"] == version


def test_more_changed_nodes_than_one_answer_holds_expire_the_version(
    client: TestClient, allocator: Allocator
) -> None:
    version = listed_version(client)
    for i in range(501):
        allocator.node_added(hgx(f"m{i:03d}"))
    r = client.get(CHANGES, params={"since": version}, headers=auth("root"))
    assert r.status_code == 410, r.text
    assert "501 nodes changed" in r.json()["message"]


def test_changes_need_inventory_read(client: TestClient) -> None:
    version = listed_version(client)
    r = client.get(CHANGES, params={"since": version}, headers=auth("alice"))
    assert r.status_code == 403, r.text
