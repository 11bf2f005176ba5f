"""``gpuportal tenants|quotas|workloads|queue|usage`` against the live portal: tables, JSON,
exit codes and the server's messages."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from portal.cli import run
from tests.portal.client.conftest import Served
from tests.portal.commands.conftest import Gpuportal

GPUPORTAL = Path(sys.executable).parent / "gpuportal"


def lines(text: str) -> list[str]:
    return text.rstrip("\n").split("\n")


# ------------------------------------------------------------------ tenants and quotas


def test_tenants_table_and_json(gpuportal: Gpuportal) -> None:
    ran = gpuportal("tenants")
    assert ran.code == 0, ran.err
    assert lines(ran.out) == [
        "TENANT  COHORT  WEIGHT  POOLS  VERSION",
        "team-a  -            1  -            1",
        "team-b  -            1  -            1",
    ]
    data = json.loads(gpuportal("tenants", "--json", token="alice").out)
    assert data == [{"cohort": None, "name": "team-a", "pools": [], "version": 1, "weight": 1.0}]


def test_quotas_table_shows_units_and_is_sorted(gpuportal: Gpuportal) -> None:
    gpuportal("quotas", "set", "team-a", "T4/share", "--guaranteed", "500", "--limit", "750")
    ran = gpuportal("quotas")
    assert ran.code == 0, ran.err
    assert lines(ran.out) == [
        "TENANT  FLAVOR     GUARANTEED  LIMIT  UNIT       BUDGET GPU-H/MONTH  VERSION",
        "team-a  H100-80GB           2      2  gpus       -                         1",
        "team-a  T4/share          500    750  milli-gpu  -                         1",
        "team-b  H100-80GB           2      4  gpus       -                         1",
    ]
    only_b = json.loads(gpuportal("quotas", "--tenant", "team-b", "--json").out)
    assert [(q["tenant"], q["flavor"], q["limit"]) for q in only_b] == [("team-b", "H100-80GB", 4)]


def test_quotas_set_changes_a_quota_and_prints_it(
    gpuportal: Gpuportal, portal_server: Served
) -> None:
    ran = gpuportal(
        "quotas", "set", "team-a", "H100-80GB", "--guaranteed", "1", "--limit", "3",
        "--budget-gpu-hours", "100", token="anna",
    )  # fmt: skip
    assert ran.code == 0, ran.err
    assert lines(ran.out)[1].split() == ["team-a", "H100-80GB", "1", "3", "gpus", "100", "2"]
    quota = portal_server.allocator.quotas("team-a")[0]
    assert (quota.guaranteed, quota.limit, quota.budget_gpu_hours) == (1, 3, 100)


def test_quotas_set_with_a_stale_etag_exits_2_with_the_servers_message(
    gpuportal: Gpuportal, portal_server: Served
) -> None:
    args = ("quotas", "set", "team-a", "H100-80GB", "--guaranteed", "1", "--limit", "2")
    assert gpuportal(*args, "--if-match", '"1"', "--json").code == 0
    ran = gpuportal(*args[:-1], "1", "--if-match", '"1"')
    assert ran.code == 2
    assert ran.out == ""
    assert ran.err.startswith("gpuportal quotas: error: ")
    assert "version" in ran.err
    assert portal_server.allocator.quotas("team-a")[0].limit == 2


def test_quotas_set_on_another_tenant_is_forbidden(gpuportal: Gpuportal) -> None:
    ran = gpuportal(
        "quotas", "set", "team-b", "H100-80GB", "--guaranteed", "0", "--limit", "0", token="anna"
    )
    assert ran.code == 2
    assert "team-b" in ran.err


# ------------------------------------------------------------------ workloads


def test_request_show_release_a_workload(gpuportal: Gpuportal, portal_server: Served) -> None:
    ran = gpuportal(
        "workloads", "request", "team-a", "H100-80GB", "--count", "2", "--name", "train",
        "--kind", "job", "--json", token="alice",
    )  # fmt: skip
    assert ran.code == 0, ran.err
    w = json.loads(ran.out)
    assert (w["state"], w["name"], w["kind"], w["owner"]) == ("running", "train", "job", "alice")
    shown = gpuportal("workloads", "show", w["id"], token="alice")
    assert shown.code == 0, shown.err
    pairs = dict(line.split(None, 1) for line in lines(shown.out) if not line.startswith("member"))
    assert (pairs["id"], pairs["state"], pairs["flavor"]) == (w["id"], "running", "H100-80GB")
    gpus = ",".join(str(g) for g in w["allocations"][0]["gpus"])
    node = w["allocations"][0]["node"]
    assert f"member 0  {node}:{gpus}  2 H100-80GB" in shown.out
    table = gpuportal("workloads", token="alice")
    assert lines(table.out)[0].split() == [
        "ID", "TENANT", "OWNER", "NAME", "KIND", "STATE", "FLAVOR", "DEVICES", "REASON"
    ]  # fmt: skip
    assert lines(table.out)[1].split() == [
        w["id"], "team-a", "alice", "train", "job", "running", "H100-80GB", f"{node}:{gpus}", "-"
    ]  # fmt: skip
    released = gpuportal("workloads", "--json", "release", w["id"], token="alice")
    assert json.loads(released.out)["state"] == "released"
    assert portal_server.allocator.workloads() == []
    assert gpuportal("workloads", token="alice").out == "(none)\n"


def test_a_queued_request_says_why_where_and_can_be_cancelled(gpuportal: Gpuportal) -> None:
    gpuportal("workloads", "request", "team-a", "H100-80GB", "--count", "2", token="alice")
    ran = gpuportal("workloads", "request", "team-a", "H100-80GB", "--name", "wait", token="alice")
    assert ran.code == 0, ran.err
    pairs = dict(line.split(None, 1) for line in lines(ran.out))
    assert pairs["state"] == "queued"
    assert pairs["reason"].startswith("quota: ")
    assert pairs["position"] == "1 (1 in team-a)"
    queue = gpuportal("queue", token="alice")
    assert queue.code == 0, queue.err
    head, row = lines(queue.out)
    assert head.split()[:9] == [
        "POS", "IN-TENANT", "WORKLOAD", "TENANT", "OWNER", "NAME", "PRIORITY", "GPU-EQ", "REASON"
    ]  # fmt: skip
    assert row.split()[:9] == ["1", "1", pairs["id"], "team-a", "alice", "wait", "0", "1", "quota"]
    listed = json.loads(gpuportal("workloads", "--state", "queued", "--json", token="alice").out)
    assert [x["id"] for x in listed] == [pairs["id"]]
    cancelled = gpuportal("workloads", "cancel", pairs["id"], "--json", token="alice")
    assert json.loads(cancelled.out)["state"] == "cancelled"
    assert gpuportal("queue", token="alice").out == "(the queue is empty)\n"


def test_a_wait_is_told_in_the_portals_words_with_or_without_an_estimate(
    gpuportal: Gpuportal,
) -> None:
    def request(name: str, *more: str) -> dict[str, str]:
        ran = gpuportal(
            "workloads", "request", "team-a", "H100-80GB", "--name", name, *more, token="alice"
        )
        assert ran.code == 0, ran.err
        return dict(line.split(None, 1) for line in lines(ran.out))

    # team-a may hold 2 H100s. Held by work without an expected end, a third waits with no
    # estimate: the CLI says so (as the spawn page and the dashboards do), never a time.
    request("a")
    held = request("b")
    assert held["state"] == "running"
    waiting = request("w1")
    assert waiting["eta"] == "waits for a release; no estimate"
    assert "waits for a release; no estimate" in lines(gpuportal("queue", token="alice").out)[1]
    # With the second GPU held by work that ends in 10 minutes, the wait has an estimate.
    gpuportal("workloads", "cancel", waiting["id"], token="alice")
    gpuportal("workloads", "release", held["id"], token="alice")
    assert request("timed", "--duration", "600")["state"] == "running"
    assert request("w2")["eta"] == "10 min"
    row = lines(gpuportal("queue", token="alice").out)[1]
    assert " 10 min " in row and "waits for a release" not in row


def test_usage_table(gpuportal: Gpuportal) -> None:
    gpuportal("workloads", "request", "team-b", "H100-80GB", "--count", "3")
    ran = gpuportal("usage")
    assert ran.code == 0, ran.err
    assert lines(ran.out) == [
        "TENANT  FLAVOR     USED  GUARANTEED  LIMIT  BORROWED  LENT  UNIT",
        "team-a  H100-80GB     0           2      2         0     0  gpus",
        "team-b  H100-80GB     3           2      4         1     0  gpus",
    ]
    data = json.loads(gpuportal("usage", "--tenant", "team-b", "--json").out)
    assert [(u["tenant"], u["used"], u["borrowed"]) for u in data] == [("team-b", 3, 1)]


# ------------------------------------------------------------------ errors


@pytest.mark.parametrize(
    ("args", "token", "message"),
    [
        (("workloads", "show", "nope"), "root", "unknown workload 'nope'"),
        (("workloads", "request", "team-b", "H100-80GB"), "alice", "team-b"),
        (
            ("workloads", "request", "team-a", "H100-80GB", "--count", "99"),
            "alice",
            "devices.count",
        ),
        (("usage", "--tenant", "team-b"), "alice", "team-b"),
        (("tenants",), "stolen", "unknown or expired token"),
        (("workloads", "request", "team-a", "H100-80GB/9g.9gb"), "alice", "MIG profile"),
    ],
)
def test_errors_exit_2_with_the_servers_message(
    gpuportal: Gpuportal, args: tuple[str, ...], token: str, message: str
) -> None:
    ran = gpuportal(*args, token=token)
    assert ran.code == 2
    assert ran.out == ""
    assert ran.err.startswith(f"gpuportal {args[0]}: error: ")
    assert message in ran.err


def test_flags_win_over_the_environment(gpuportal: Gpuportal, portal_server: Served) -> None:
    ran = gpuportal("tenants", "--url", portal_server.url, "--token", "bob", token="alice")
    assert ran.out.split("\n")[1].startswith("team-b")


def test_without_url_or_token_the_error_names_the_variables(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for var in ("GPUPORTAL_URL", "JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN"):
        monkeypatch.delenv(var, raising=False)
    assert run(["queue", "--token", "t"]) == 2
    assert "GPUPORTAL_URL" in capsys.readouterr().err
    assert run(["queue", "--url", "http://127.0.0.1:9/"]) == 2
    assert "JUPYTERHUB_API_TOKEN" in capsys.readouterr().err


def test_an_unreachable_portal_exits_2_naming_the_url(gpuportal: Gpuportal) -> None:
    ran = gpuportal("usage", "--url", "http://127.0.0.1:9/services/gpuportal/")
    assert ran.code == 2
    assert "cannot reach the portal at http://127.0.0.1:9/services/gpuportal/" in ran.err


def test_request_wait_exits_1_when_it_does_not_start_in_time(gpuportal: Gpuportal) -> None:
    gpuportal("workloads", "request", "team-a", "H100-80GB", "--count", "2", token="alice")
    ran = gpuportal(
        "workloads", "request", "team-a", "H100-80GB", "--wait", "0.2", "--json", token="alice"
    )
    assert (ran.code, json.loads(ran.out)["state"]) == (1, "queued")
    ran = gpuportal("workloads", "request", "team-b", "H100-80GB", "--wait", "5", token="bob")
    assert ran.code == 0, ran.err
    assert "running" in ran.out


def test_tenants_set_creates_then_changes_only_what_is_given(gpuportal: Gpuportal) -> None:
    ran = gpuportal("tenants", "set", "team-c", "--cohort", "research", "--pool", "big")
    assert ran.code == 0, ran.err
    assert lines(ran.out)[1].split() == ["team-c", "research", "1", "big", "1"]
    ran = gpuportal("tenants", "set", "team-c", "--weight", "2.5", "--json")
    assert json.loads(ran.out) == {
        "cohort": "research", "name": "team-c", "pools": ["big"], "version": 2, "weight": 2.5
    }  # fmt: skip
    ran = gpuportal("tenants", "set", "team-c", "--no-cohort", "--no-pools")
    assert lines(ran.out)[1].split() == ["team-c", "-", "2.5", "-", "3"]
    stale = gpuportal("tenants", "set", "team-c", "--weight", "1", "--if-match", '"1"')
    assert stale.code == 2
    assert "gpuportal tenants: error: " in stale.err
    refused = gpuportal("tenants", "set", "team-a", "--weight", "9", token="anna")
    assert refused.code == 2
    assert "admin" in refused.err


def test_the_console_script_prints_a_table_and_exits_2_on_errors(portal_server: Served) -> None:
    env = {**os.environ, "GPUPORTAL_URL": portal_server.url, "JUPYTERHUB_API_TOKEN": "alice"}
    ok = subprocess.run(
        [str(GPUPORTAL), "usage"], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.split("\n")[1].split()[:3] == ["team-a", "H100-80GB", "0"]
    refused = subprocess.run(
        [str(GPUPORTAL), "usage", "--tenant", "team-b"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert refused.returncode == 2
    assert refused.stderr.startswith("gpuportal usage: error: ")
    assert "team-b" in refused.stderr
