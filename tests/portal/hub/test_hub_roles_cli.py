"""``gpuportal hub-roles`` prints what ``render_config`` gives; bad tenants exit 2."""

from __future__ import annotations

import pytest

from portal.cli import run
from portal.hubroles import HubRolesSpec, render_config


def test_hub_roles_prints_the_configuration(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["hub-roles", "team-a", "team-b", "--oauth-service", "gpuportal-dashboards"]
    assert run(argv) == 0
    spec = HubRolesSpec(("team-a", "team-b"), oauth_services=("gpuportal-dashboards",))
    assert capsys.readouterr().out == render_config(spec)


def test_hub_roles_refuses_a_bad_tenant_name(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(["hub-roles", "Team_A"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "Team_A" in captured.err and "DNS-1123" in captured.err
