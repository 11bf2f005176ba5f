"""``gpuportal alerts`` over alerts saved as the alert service saves them."""

from __future__ import annotations

import json

from tests.portal.client.conftest import Served
from tests.portal.client.test_alerts import stored
from tests.portal.commands.conftest import Gpuportal

__all__ = ["stored"]


def test_alerts_command(stored: Served, gpuportal: Gpuportal) -> None:
    ran = gpuportal("alerts")
    assert ran.code == 0, ran.err
    head, *rows = ran.out.rstrip("\n").split("\n")
    assert head.split() == [
        "SINCE", "STATE", "RULE", "TENANT", "OWNER", "SUBJECT", "VALUE", "SUMMARY"
    ]  # fmt: skip
    assert [r.split()[2:7] for r in rows] == [
        ["pending", "xid", "-", "-", "n1-0"],
        ["firing", "noisy_neighbour", "team-b", "bob", "w-bob"],
        ["firing", "idle", "team-a", "carol", "w-carol"],
        ["firing", "idle", "team-a", "alice", "w-alice"],
    ]
    mine = json.loads(gpuportal("alerts", "--json", token="alice").out)
    assert [a["subject"] for a in mine] == ["w-alice"]
    assert gpuportal("alerts", "--state", "firing", "--rule", "idle", token="bob").out == (
        "(no alerts)\n"
    )
    bad = gpuportal("alerts", "--state", "angry")
    assert bad.code == 2
    assert "state" in bad.err
