"""``gpuportal elastic`` against the live portal: show, set (values not given are kept),
limits for platform admins only."""

from __future__ import annotations

import json

import pytest

from portal.cli import run
from tests.portal.commands.conftest import Gpuportal


def test_show_then_set_keeps_what_is_not_given(gpuportal: Gpuportal) -> None:
    shown = gpuportal("elastic", "show", "team-a", "--json", token="anna")
    assert shown.code == 0, shown.err
    assert json.loads(shown.out)["version"] == 0
    ran = gpuportal("elastic", "set", "team-a", "--max-idle-s", "900", "--idle-s", "600")
    assert ran.code == 0, ran.err
    ran = gpuportal("elastic", "set", "team-a", "--threshold", "0.9", "--json", token="anna")
    assert ran.code == 0, ran.err
    out = json.loads(ran.out)
    assert (out["threshold"], out["idle_s"], out["limits"]["max_idle_s"]) == (0.9, 600.0, 900.0)
    assert out["version"] == 2
    table = gpuportal("elastic", "show", "team-a").out.splitlines()
    assert table[0].split()[:2] == ["TENANT", "THRESHOLD"]
    assert table[1].split() == ["team-a", "0.9", "300", "600", "0.01", "0", "0", "900", "2"]


def test_a_tenant_admin_cannot_set_limits_or_leave_them(gpuportal: Gpuportal) -> None:
    assert gpuportal("elastic", "set", "team-a", "--max-idle-s", "900", "--idle-s", "900").code == 0
    limits = gpuportal("elastic", "set", "team-a", "--min-threshold", "0.1", token="anna")
    assert limits.code == 2 and "platform admin" in limits.err
    longer = gpuportal("elastic", "set", "team-a", "--idle-s", "1000", token="anna")
    assert longer.code == 2 and "elastic.idle_s" in longer.err
    other = gpuportal("elastic", "set", "team-b", "--threshold", "0.9", token="anna")
    assert other.code == 2 and "team-b" in other.err


def test_no_action_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        run(["elastic"])
    assert exited.value.code == 2
    assert "ACTION" in capsys.readouterr().err
