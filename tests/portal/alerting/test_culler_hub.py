"""GPU-aware idle culling against a real JupyterHub.

The hub runs real single-user servers (``tests/spawner/tiny_server.py`` through JupyterHub's
SimpleLocalProcessSpawner) for four users: alice and carol hold an idle GPU each, bob a busy
one, dave has a CPU-only server. Samples go through the real ingest route, the real alert
service evaluates once a simulated minute, and the culler talks to the hub's REST API.

Expected, with the idle rule's defaults (5 %, 30 min) and a policy of warning as soon as the
idle alert fires and stopping 10 minutes later:

- minute 31: alice's and carol's idle alerts fire; both are warned at once;
- minute 35: carol's GPU is busy again (samples of minute 34): her warning resolves;
- minute 41: alice's server is stopped through the hub; bob's, carol's and dave's keep running.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest

from policies.alerts import AlertState
from portal.alerting.culler import RULE, Culler, CullPolicy
from tests.portal.alerting.conftest import Scenario, gpu
from tests.support.hub import HubFactory, RunningHub

pytestmark = [pytest.mark.hub, pytest.mark.slow]

TINY_SERVER = Path(__file__).parents[2] / "spawner" / "tiny_server.py"
CULLER_TOKEN = "c" * 32
USERS = ("alice", "bob", "carol", "dave")


def hub_config(home: Path) -> str:
    settings: dict[str, object] = {
        "JupyterHub.authenticator_class": "dummy",
        "Authenticator.allowed_users": set(USERS),
        "JupyterHub.spawner_class": "simple",
        "SimpleLocalProcessSpawner.home_dir_template": str(home / "{username}"),
        "Spawner.cmd": [sys.executable, str(TINY_SERVER)],
        "Spawner.start_timeout": 60,
        "Spawner.http_timeout": 60,
        "JupyterHub.services": [{"name": "gpu-culler", "api_token": CULLER_TOKEN}],
        "JupyterHub.load_roles": [
            {
                "name": "gpu-culler",
                "services": ["gpu-culler"],
                "scopes": ["admin:servers", "admin:users"],
            }
        ],
    }
    return "".join(f"c.{k} = {v!r}\n" for k, v in settings.items())


def api(hub: RunningHub, method: str, path: str) -> httpx.Response:
    return httpx.request(
        method,
        hub.api_url + path,
        headers={"Authorization": f"token {CULLER_TOKEN}"},
        timeout=30,
    )


def server_ready(hub: RunningHub, user: str) -> bool:
    r = api(hub, "GET", f"/users/{user}")
    assert r.status_code == 200, r.text
    server = r.json()["servers"].get("")
    return bool(server and server["ready"])


def wait_for(check: object, what: str, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_an_idle_gpu_server_is_warned_then_stopped_and_others_are_not(
    hub_factory: HubFactory, sqlite_scenario: Scenario, tmp_path: Path
) -> None:
    scenario = sqlite_scenario
    (tmp_path / "home").mkdir()
    hub = hub_factory(hub_config(tmp_path / "home"))
    for user in USERS:
        assert api(hub, "POST", f"/users/{user}").status_code in (201, 409)
        assert api(hub, "POST", f"/users/{user}/server").status_code in (201, 202)
    for user in USERS:
        wait_for(lambda user=user: server_ready(hub, user), f"{user}'s server")
    hub.remember_descendants()

    p = scenario.portal
    alice = p.gpus("team-a", 1, owner="alice", name="alice/default")
    bob = p.gpus("team-b", 1, owner="bob", name="bob/default")
    carol = p.gpus("team-a", 1, owner="carol", name="carol/default")
    (ga,), (gb,), (gc,) = p.devices_of(alice), p.devices_of(bob), p.devices_of(carol)

    service = scenario.start()
    told: list[tuple[str | None, AlertState]] = []  # what a webhook would have been sent
    culler = Culler(
        p.alloc,
        hub.api_url,
        CULLER_TOKEN,
        lambda: service.state.firing(),  # the state is replaced at every evaluation
        default=CullPolicy(warn_after_s=0, grace_s=600),
        notify=[lambda ts, now: told.extend((t.alert.owner, t.alert.state) for t in ts)],
    )
    service.actions.append(culler)

    def minute(k: int) -> list[tuple[str, dict[str, object]]]:
        return [
            ("n1", gpu(ga, 1.0)),
            ("n1", gpu(gb, 70.0)),
            ("n1", gpu(gc, 2.0 if k < 34 else 80.0)),
        ]

    scenario.run(range(31), minute)  # evaluations at minutes 1..31
    warnings = {a.alert.owner: a for a in service.store.alerts(rule=RULE)}
    assert set(warnings) == {"alice", "carol"}
    assert all(w.state is AlertState.FIRING for w in warnings.values())
    assert warnings["alice"].alert.active_since == scenario.clock.now  # warned at minute 31
    assert "will be stopped at 2026-11-02 09:41 UTC" in warnings["alice"].alert.summary

    scenario.run(range(31, 40), minute)  # up to minute 40: grace not over
    assert all(server_ready(hub, u) for u in USERS)
    carol_warning = {a.alert.owner: a for a in service.store.alerts(rule=RULE)}["carol"]
    assert carol_warning.state is AlertState.RESOLVED
    assert carol_warning.alert.resolved_at is not None
    assert "in use again" in carol_warning.alert.summary

    scenario.run(range(40, 41), minute)  # minute 41: alice's grace is over
    assert culler.stopped == {alice}
    wait_for(lambda: not api(hub, "GET", "/users/alice").json()["servers"], "alice's stop")
    assert all(server_ready(hub, u) for u in ("bob", "carol", "dave"))
    alice_warning = {a.alert.owner: a for a in service.store.alerts(rule=RULE)}["alice"]
    assert alice_warning.state is AlertState.RESOLVED
    assert "was stopped at 2026-11-02 09:41 UTC" in alice_warning.alert.summary

    # Still allocated (no spawner here releases it): never warned or stopped twice.
    scenario.run(range(41, 43), minute)
    assert len(service.store.alerts(rule=RULE)) == 2
    firing, resolved = AlertState.FIRING, AlertState.RESOLVED
    # alice and carol are warned in the same evaluation (in no particular order); carol's
    # warning resolves at minute 34, alice's when she is stopped at minute 41.
    assert sorted(told[:2]) == [("alice", firing), ("carol", firing)]
    assert told[2:] == [("carol", resolved), ("alice", resolved)]
    culler.close()
