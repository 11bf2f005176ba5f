"""``gpuportal cost [chargeback|budgets]``, ``offers`` and ``nodes`` against the live portal."""

from __future__ import annotations

import json

from tests.portal.commands.conftest import Gpuportal

WINDOW = ("--start", "2026-11-02T09:00Z", "--end", "2026-11-02T11:00Z")


def lines(text: str) -> list[str]:
    return text.rstrip("\n").split("\n")


def test_cost_table_groups_and_totals(gpuportal: Gpuportal) -> None:
    gpuportal("workloads", "request", "team-b", "H100-80GB", "--count", "2")
    gpuportal("workloads", "request", "team-a", "H100-80GB")
    ran = gpuportal("cost", *WINDOW)
    assert ran.code == 0, ran.err
    assert lines(ran.out) == [
        "2026-11-02 09:00 .. 2026-11-02 11:00 UTC",
        "no price for H100-80GB: counted at 0",
        "TENANT  GPU-H  USED GPU-H  EFFICIENCY  COST USD  IDLE COST",
        "team-a      2  -           -           0.00      -",
        "team-b      4  -           -           0.00      -",
        "TOTAL       6  -           -           0.00      -",
    ]
    by = gpuportal("cost", *WINDOW, "--by", "owner", "--by", "flavor", "--json")
    data = json.loads(by.out)
    assert data["group_by"] == ["owner", "flavor"]
    assert [(g["owner"], g["flavor"], g["allocated_gpu_hours"]) for g in data["groups"]] == [
        ("portal-admin", "H100-80GB", 6.0)
    ]


def test_chargeback_prints_the_csv(gpuportal: Gpuportal) -> None:
    gpuportal("workloads", "request", "team-b", "H100-80GB")
    ran = gpuportal("cost", "chargeback", *WINDOW, "--tenant", "team-b")
    assert ran.code == 0, ran.err
    head, row = lines(ran.out)
    assert "tenant" in head.split(",")
    assert "team-b" in row.split(",")


def test_budgets_table(gpuportal: Gpuportal) -> None:
    gpuportal(
        "quotas", "set", "team-b", "H100-80GB", "--guaranteed", "2", "--limit", "4",
        "--budget-gpu-hours", "100",
    )  # fmt: skip
    ran = gpuportal("cost", "budgets", "--tenant", "team-b")
    assert ran.code == 0, ran.err
    head, row = lines(ran.out)
    assert head.split()[:4] == ["TENANT", "FLAVOR", "KIND", "BUDGET"]
    assert row.split()[:4] == ["team-b", "H100-80GB", "gpu_hours", "100"]


def test_cost_errors_exit_2(gpuportal: Gpuportal) -> None:
    ran = gpuportal("cost", "--start", "yesterday")
    assert (ran.code, ran.out) == (2, "")
    assert "invalid --start 'yesterday': expected an ISO 8601 time" in ran.err
    reversed_window = gpuportal("cost", "--start", "2026-11-02T11:00Z", "--end", "2026-11-02")
    assert reversed_window.code == 2
    assert "invalid end" in reversed_window.err
    assert gpuportal("cost", token="alice").code == 2  # no cost:read


def test_offers_table(gpuportal: Gpuportal) -> None:
    gpuportal("workloads", "request", "team-a", "H100-80GB", "--count", "2", token="alice")
    ran = gpuportal("offers", "team-a", token="alice")
    assert ran.code == 0, ran.err
    rows = {line.split()[0]: line for line in lines(ran.out)[1:]}
    assert "queued" in rows["gpu:H100-80GB:1"]
    assert "quota" in rows["gpu:H100-80GB:1"]
    assert "not_allowed" in rows["gpu:H100-80GB:4"]
    data = json.loads(gpuportal("offers", "team-a", "--json", token="alice").out)
    assert {o["key"] for o in data} >= {"gpu:H100-80GB:1", "gpu:H100-80GB:4"}


def test_nodes_table(gpuportal: Gpuportal) -> None:
    gpuportal("workloads", "request", "team-b", "H100-80GB", "--count", "3")
    ran = gpuportal("nodes")
    assert ran.code == 0, ran.err
    head, *rows = lines(ran.out)
    assert head.split() == [
        "NODE", "MODELS", "GPUS", "FREE", "MIG", "FREE/ALL", "POOL", "RACK", "SCHEDULABLE"
    ]  # fmt: skip
    cells = [r.split() for r in rows]
    assert [c[:4] for c in cells] == [
        ["n1", "H100-80GB", "8", "5"],
        ["n2", "H100-80GB", "8", "8"],
        ["t1", "T4", "2", "2"],
    ]
    assert [c[-1] for c in cells] == ["yes", "yes", "yes"]
    data = json.loads(gpuportal("nodes", "--json").out)
    assert [n["name"] for n in data] == ["n1", "n2", "t1"]


def test_request_an_offer_by_its_key(gpuportal: Gpuportal) -> None:
    ran = gpuportal(
        "workloads", "request", "team-a", "--option", "gpu:H100-80GB:2", "--json", token="alice"
    )
    assert ran.code == 0, ran.err
    w = json.loads(ran.out)
    assert (w["state"], [len(a["gpus"]) for a in w["allocations"]]) == ("running", [2])
    one = gpuportal("workloads", "request", "team-a", "--option", "gpu:H100-80GB:1", "--json")
    assert json.loads(one.out)["state"] == "queued"  # team-a's 2 GPUs are in use
    unknown = gpuportal("workloads", "request", "team-a", "--option", "gpu:H100-80GB:3")
    assert unknown.code == 2
    assert "invalid --option 'gpu:H100-80GB:3': expected one of cpu, gpu:H100-80GB:1" in (
        unknown.err
    )
    both = gpuportal("workloads", "request", "team-a", "H100-80GB", "--option", "cpu")
    neither = gpuportal("workloads", "request", "team-a")
    assert (both.code, neither.code) == (2, 2)
    assert "either a flavor" in both.err
    assert "invalid FLAVOR missing" in neither.err
