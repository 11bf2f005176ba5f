"""JupyterHub roles and custom scopes of the portal: what the hub must be configured with.

Permissions are JupyterHub's (architecture decision 2): the portal defines custom scopes
(``portal.api.auth.Scope``) and this module turns a list of tenants into the roles that grant
them, as the values of ``c.JupyterHub.custom_scopes`` and ``c.JupyterHub.load_roles``.
``render_config`` writes them as ``jupyterhub_config.py`` text for the demo and the Helm chart.
Pure: typed, frozen inputs in, plain data (or text) out.

Roles (``docs/roles.md`` explains each choice), for tenant ``t``:

- ``gpuportal-member-t`` (group ``t``): request, release and read workloads; read the queue,
  quotas, usage and inventory; call the tenant's inference services; all filtered ``!group=t``.
- ``gpuportal-tenant-admin-t`` (group ``t-admins``): the member's scopes plus ``quotas:write``
  and ``cost:read``, all filtered ``!group=t``; nothing else.
- ``gpuportal-leadership`` (group ``gpuportal-leadership``): ``cost:read`` and ``usage:read``
  of every tenant; nothing that writes.
- ``gpuportal-platform-admin`` (group ``gpuportal-admins``): ``custom:gpuportal:admin``, and
  each scope an OAuth service may ask for, unfiltered (``PLATFORM_ADMIN_SCOPES``).
- ``gpuportal-service`` (service ``gpuportal``): the hub API calls the portal makes (list
  users and groups, read activity and servers, stop idle GPU servers).
"""

from __future__ import annotations

import pprint
import re
from collections.abc import Sequence
from dataclasses import dataclass, field

from policies.errors import InvalidRequest
from policies.quota import validate_tenant_name
from portal.api.auth import GROUP_FILTER, SCOPE_HELP, Scope

ROLE_PREFIX = "gpuportal-"

MEMBER_SCOPES: tuple[Scope, ...] = (
    Scope.WORKLOADS_WRITE,
    Scope.WORKLOADS_READ,
    Scope.QUEUE_READ,
    Scope.QUOTAS_READ,
    Scope.USAGE_READ,
    Scope.INVENTORY_READ,
    Scope.SERVICES_CALL,
)
"""What a tenant's members may do, each filtered to their tenant's group."""

TENANT_ADMIN_SCOPES: tuple[Scope, ...] = (*MEMBER_SCOPES, Scope.QUOTAS_WRITE, Scope.COST_READ)
"""A tenant admin's: the members' plus changing quotas and reading cost, filtered likewise."""

LEADERSHIP_SCOPES: tuple[Scope, ...] = (Scope.COST_READ, Scope.USAGE_READ)
"""Read-only, every tenant."""

PLATFORM_ADMIN_SCOPES: tuple[Scope, ...] = (
    Scope.ADMIN,
    *TENANT_ADMIN_SCOPES,
    Scope.METRICS_READ,
)
"""Every portal scope. ``admin`` implies the others in the portal, but the hub knows nothing
of that: it hands an OAuth client (the dashboards, a server's token) the intersection of what
the client may ask for and what the person holds, scope by scope. A client that may not ask
for ``admin`` (the dashboards may not) would get none of a platform admin's power unless the
role names each scope too. ``telemetry:write`` stays the node agents' own."""

SERVICE_HUB_SCOPES: tuple[str, ...] = (
    "list:users",  # whose servers exist
    "read:users:activity",  # last activity, next to GPU utilization, decides idleness
    "read:servers",  # which servers run, and where
    "servers",  # stop an idle GPU server (DELETE /users/:name/server); nothing starts them
    "list:groups",  # tenants are groups
    "read:groups",  # and their members
)
"""What the portal's own service needs from the hub's API, and nothing more: it never creates
users, tokens or groups, and never touches the hub's admin scopes."""

# JupyterHub's rule for role names (jupyterhub.roles._validate_role_name).
_ROLE_NAME_RE = re.compile(r"^[a-z][a-z0-9\-_~\.]{1,253}[a-z0-9]$")
_NAME_RE = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9._\-:@]{0,254}$")


@dataclass(frozen=True, slots=True)
class HubRolesSpec:
    """What the hub's roles depend on.

    Args:
        tenants: tenant names (JupyterHub groups), DNS-1123 labels.
        admin_group_template: the hub group of a tenant's admins; ``{tenant}`` is replaced.
        leadership_group: the hub group that reads cost and usage of every tenant.
        platform_admin_group: the hub group that holds ``custom:gpuportal:admin``.
        service: the portal's JupyterHub service name.
        oauth_services: services people log in to with the hub's OAuth (the dashboards);
            every role above may access them.
    """

    tenants: tuple[str, ...]
    admin_group_template: str = "{tenant}-admins"
    leadership_group: str = "gpuportal-leadership"
    platform_admin_group: str = "gpuportal-admins"
    service: str = "gpuportal"
    oauth_services: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.tenants, tuple):
            raise InvalidRequest("tenants", repr(self.tenants), "a tuple of tenant names")
        for t in self.tenants:
            validate_tenant_name(t)
        if len(set(self.tenants)) != len(self.tenants):
            raise InvalidRequest("tenants", repr(self.tenants), "each tenant once")
        if "{tenant}" not in self.admin_group_template:
            raise InvalidRequest(
                "admin_group_template",
                repr(self.admin_group_template),
                "a group name containing '{tenant}', such as '{tenant}-admins'",
            )
        names = {
            "leadership_group": self.leadership_group,
            "platform_admin_group": self.platform_admin_group,
            "service": self.service,
            **{f"admin group of {t}": self.admin_group(t) for t in self.tenants},
            **{f"oauth service {s!r}": s for s in self.oauth_services},
        }
        for what, name in names.items():
            if not isinstance(name, str) or not _NAME_RE.fullmatch(name):
                raise InvalidRequest(
                    what, repr(name), "1 to 255 of letters, digits, '.', '_', '-', ':', '@'"
                )
        groups = [self.leadership_group, self.platform_admin_group]
        groups += [self.admin_group(t) for t in self.tenants]
        taken = set(self.tenants)
        for g in groups:
            if g in taken:
                raise InvalidRequest(
                    "group", repr(g), "a group that is not also a tenant or another role's group"
                )
            taken.add(g)

    def admin_group(self, tenant: str) -> str:
        return self.admin_group_template.replace("{tenant}", tenant)


Role = dict[str, object]


def custom_scopes() -> dict[str, dict[str, object]]:
    """``c.JupyterHub.custom_scopes``: every portal scope with its description; ``admin``
    lists every other portal scope as its subscopes. The hub then expands a held admin scope
    (filter included) into them, so a token it narrows to named portal scopes, such as the
    dashboards' OAuth token (``oauth_client_allowed_scopes``), keeps them for an admin instead
    of losing them all: the hub knows nothing of what the portal reads ``admin`` as."""
    out: dict[str, dict[str, object]] = {s.value: {"description": SCOPE_HELP[s]} for s in Scope}
    out[Scope.ADMIN.value]["subscopes"] = [s.value for s in Scope if s is not Scope.ADMIN]
    return out


def _filtered(scopes: Sequence[Scope], tenant: str) -> list[str]:
    return [f"{s.value}{GROUP_FILTER}{tenant}" for s in scopes]


def _access(spec: HubRolesSpec) -> list[str]:
    return [f"access:services!service={s}" for s in spec.oauth_services]


def load_roles(spec: HubRolesSpec) -> list[Role]:
    """``c.JupyterHub.load_roles``: one member and one tenant-admin role per tenant, then
    leadership, platform admin and the portal service, in that (stable) order."""
    roles: list[Role] = []
    for t in spec.tenants:
        roles.append(
            {
                "name": f"{ROLE_PREFIX}member-{t}",
                "description": f"members of tenant {t}: use and read its GPUs",
                "groups": [t],
                "scopes": [*_filtered(MEMBER_SCOPES, t), *_access(spec)],
            }
        )
        roles.append(
            {
                "name": f"{ROLE_PREFIX}tenant-admin-{t}",
                "description": f"admins of tenant {t}: its quotas and cost, nothing else",
                "groups": [spec.admin_group(t)],
                "scopes": [*_filtered(TENANT_ADMIN_SCOPES, t), *_access(spec)],
            }
        )
    roles.append(
        {
            "name": f"{ROLE_PREFIX}leadership",
            "description": "cost and usage of every tenant, read-only",
            "groups": [spec.leadership_group],
            "scopes": [*(s.value for s in LEADERSHIP_SCOPES), *_access(spec)],
        }
    )
    roles.append(
        {
            "name": f"{ROLE_PREFIX}platform-admin",
            "description": "every portal scope for every tenant",
            "groups": [spec.platform_admin_group],
            "scopes": [*(s.value for s in PLATFORM_ADMIN_SCOPES), *_access(spec)],
        }
    )
    roles.append(
        {
            "name": f"{ROLE_PREFIX}service",
            "description": "what the portal service needs from the hub API",
            "services": [spec.service],
            "scopes": list(SERVICE_HUB_SCOPES),
        }
    )
    for role in roles:
        name = str(role["name"])
        if not _ROLE_NAME_RE.fullmatch(name):
            raise InvalidRequest("role name", repr(name), "at most 255 characters")
    return roles


def render_config(spec: HubRolesSpec) -> str:
    """``jupyterhub_config.py`` text setting the portal's custom scopes and roles.

    Roles the deployment defines itself can be added after it (``c.JupyterHub.load_roles +=
    [...]``); the text assigns, so it goes before them.
    """
    scopes = pprint.pformat(custom_scopes(), width=96)
    roles = pprint.pformat(load_roles(spec), width=96, sort_dicts=False)
    return (
        "# The portal's JupyterHub custom scopes and roles (generated by portal.hubroles).\n"
        f"c.JupyterHub.custom_scopes = {scopes}\n"
        f"c.JupyterHub.load_roles = {roles}\n"
    )
