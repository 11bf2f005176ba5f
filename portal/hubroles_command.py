"""``gpuportal hub-roles``: print the hub configuration of the portal's scopes and roles."""

from __future__ import annotations

import argparse
from typing import Any

from portal.hubroles import HubRolesSpec, render_config


def register(commands: Any) -> None:
    """Add ``hub-roles`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "hub-roles",
        help="print jupyterhub_config lines defining the portal's custom scopes and roles",
        description=(
            "Print c.JupyterHub.custom_scopes and c.JupyterHub.load_roles for the given "
            "tenants (JupyterHub groups): a member and a tenant-admin role per tenant, "
            "leadership, platform admin and the portal service's role (docs/roles.md). "
            "Append the output to jupyterhub_config.py, or to the Helm chart's hub.extraConfig."
        ),
    )
    parser.add_argument("tenants", nargs="+", metavar="TENANT", help="tenant names")
    parser.add_argument(
        "--admin-group-template",
        default="{tenant}-admins",
        help="hub group of a tenant's admins (default: {tenant}-admins)",
    )
    parser.add_argument(
        "--leadership-group", default="gpuportal-leadership", help="hub group of leadership"
    )
    parser.add_argument(
        "--platform-admin-group", default="gpuportal-admins", help="hub group of platform admins"
    )
    parser.add_argument("--service", default="gpuportal", help="the portal's hub service name")
    parser.add_argument(
        "--oauth-service",
        action="append",
        default=[],
        dest="oauth_services",
        help="a service the roles may log in to with the hub's OAuth (repeat)",
    )
    parser.set_defaults(handler=hub_roles)


def hub_roles(args: argparse.Namespace) -> int:
    spec = HubRolesSpec(
        tuple(args.tenants),
        admin_group_template=args.admin_group_template,
        leadership_group=args.leadership_group,
        platform_admin_group=args.platform_admin_group,
        service=args.service,
        oauth_services=tuple(args.oauth_services),
    )
    print(render_config(spec), end="")
    return 0
