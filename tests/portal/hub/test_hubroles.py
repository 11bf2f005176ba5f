"""The hub's custom scopes and roles, as data and as configuration text."""

from __future__ import annotations

from pathlib import Path

import pytest
from traitlets.config import Config

from policies.errors import InvalidRequest
from portal.api.auth import Scope
from portal.dashboard_views import DASHBOARDS_OAUTH_SCOPES
from portal.hubroles import HubRolesSpec, custom_scopes, load_roles, render_config

GOLDEN = Path(__file__).parent / "golden"
SPEC = HubRolesSpec(("team-a", "team-b"), oauth_services=("gpuportal-dashboards",))


def test_the_rendered_roles_match_the_golden_file() -> None:
    # Only the roles: the custom scopes follow portal.api.auth.Scope, which others extend
    # (checked below against the enum). To change the roles on purpose, write the part of
    # render_config(SPEC) from "c.JupyterHub.load_roles" on to the file and review the diff.
    text = render_config(SPEC)
    roles = text[text.index("c.JupyterHub.load_roles = ") :]
    assert roles == (GOLDEN / "roles_config.txt").read_text()


def test_the_rendered_text_is_python_that_sets_exactly_the_data() -> None:
    c = Config()
    exec(render_config(SPEC), {"c": c})
    assert c.JupyterHub.custom_scopes == custom_scopes()
    assert c.JupyterHub.load_roles == load_roles(SPEC)


def test_every_portal_scope_is_defined_with_a_description() -> None:
    scopes = custom_scopes()
    assert set(scopes) == {s.value for s in Scope}
    assert all(d["description"] for d in scopes.values())


def roles_by_name() -> dict[str, dict[str, object]]:
    return {str(r["name"]): r for r in load_roles(SPEC)}


def test_tenant_roles_are_filtered_to_their_own_group_only() -> None:
    roles = roles_by_name()
    for tenant in SPEC.tenants:
        for role, group in (("member", tenant), ("tenant-admin", f"{tenant}-admins")):
            r = roles[f"gpuportal-{role}-{tenant}"]
            assert r["groups"] == [group]
            portal = [s for s in r["scopes"] if s.startswith("custom:")]  # type: ignore[attr-defined]
            assert portal and all(s.endswith(f"!group={tenant}") for s in portal)
    admin_a = roles["gpuportal-tenant-admin-team-a"]["scopes"]
    assert "custom:gpuportal:quotas:write!group=team-a" in admin_a  # type: ignore[operator]
    member_a = roles["gpuportal-member-team-a"]["scopes"]
    assert not any("quotas:write" in s or "cost:read" in s for s in member_a)  # type: ignore[attr-defined]


def test_leadership_reads_cost_and_usage_everywhere_and_writes_nothing() -> None:
    scopes = roles_by_name()["gpuportal-leadership"]["scopes"]
    portal = {s for s in scopes if s.startswith("custom:")}  # type: ignore[attr-defined]
    assert portal == {Scope.COST_READ.value, Scope.USAGE_READ.value}


def test_the_service_role_holds_no_hub_admin_or_token_scopes() -> None:
    scopes = roles_by_name()["gpuportal-service"]["scopes"]
    assert not any(s.startswith(("admin", "tokens", "custom:")) for s in scopes)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"tenants": ("Team-A",)}, "tenant"),
        ({"tenants": ("team-ä",)}, "tenant"),
        ({"tenants": ("a" * 64,)}, "tenant"),
        ({"tenants": ("team-a", "team-a")}, "tenants"),
        ({"tenants": "team-a"}, "tenants"),
        ({"tenants": ("team-a",), "admin_group_template": "admins"}, "admin_group_template"),
        ({"tenants": ("team-a", "team-a-admins")}, "group"),
        ({"tenants": ("x",), "leadership_group": "gpuportal-admins"}, "group"),
        ({"tenants": ("x",), "service": "has space"}, "service"),
        ({"tenants": ("x",), "oauth_services": ("",)}, "oauth service"),
    ],
)
def test_bad_input_is_refused_naming_the_value(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(InvalidRequest, match="expected") as err:
        HubRolesSpec(**kwargs)  # type: ignore[arg-type]
    assert field in str(err.value)


@pytest.mark.parametrize(
    ("held", "kept"),
    [
        # The platform admin: every scope the dashboards ask for, for every tenant.
        ("custom:gpuportal:admin", {s.value for s in DASHBOARDS_OAUTH_SCOPES}),
        # An admin filtered to one tenant keeps the filter on each.
        (
            "custom:gpuportal:admin!group=team-a",
            {f"{s.value}!group=team-a" for s in DASHBOARDS_OAUTH_SCOPES},
        ),
    ],
)
def test_the_hub_keeps_the_dashboards_scopes_of_an_admin_when_it_narrows_the_token(
    monkeypatch: pytest.MonkeyPatch, held: str, kept: set[str]
) -> None:
    """The hub's own resolution of an OAuth token's scopes (what the user holds, narrowed to
    the client's ``oauth_client_allowed_scopes``), with the portal's custom scopes defined:
    ``admin`` must not vanish from the dashboards' token for want of a name the hub knows."""
    from jupyterhub import scopes as hub_scopes

    monkeypatch.setattr(hub_scopes, "scope_definitions", dict(hub_scopes.scope_definitions))
    hub_scopes.define_custom_scopes(custom_scopes())
    requested = {s.value for s in DASHBOARDS_OAUTH_SCOPES}
    allowed, _refused = hub_scopes._resolve_requested_scopes(
        requested, {held}, user=None, client=None, db=None
    )
    assert allowed == kept
