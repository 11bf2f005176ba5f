"""``gpuportal tenants`` (list) and ``gpuportal tenants set`` (create or change one)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from portal.commands.common import add_connection_options, call, print_json, table

if TYPE_CHECKING:
    from portal.api.schemas import TenantOut
    from portal.client import Portal, WithETag

HEADERS = ("TENANT", "COHORT", "WEIGHT", "POOLS", "VERSION")


def register(commands: Any) -> None:
    """Add ``tenants`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "tenants",
        help="list tenants (JupyterHub groups) with cohort, weight and pools; `tenants set`",
        description="List the tenants the token may read (scope quotas:read), by name.",
    )
    add_connection_options(parser)
    parser.set_defaults(handler=list_tenants)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    set_cmd = actions.add_parser(
        "set",
        help="create a tenant, or change its cohort, weight or pools (platform admins)",
        description=(
            "Create the tenant if it does not exist, else change what the options say and keep "
            "the rest. With --if-match the change applies only if the tenant is still at that "
            "ETag; without it the current one is read first. Needs the unfiltered admin scope."
        ),
    )
    set_cmd.add_argument("name", help="the tenant: a JupyterHub group name")
    cohort = set_cmd.add_mutually_exclusive_group()
    cohort.add_argument("--cohort", default=None, help="lend and borrow within this cohort")
    cohort.add_argument("--no-cohort", action="store_true", help="leave its cohort")
    set_cmd.add_argument("--weight", type=float, default=None, help="fair-share weight (> 0)")
    pools = set_cmd.add_mutually_exclusive_group()
    pools.add_argument(
        "--pool", action="append", default=None, help="node pool it may use (repeat; replaces)"
    )
    pools.add_argument("--no-pools", action="store_true", help="no reserved pools")
    set_cmd.add_argument("--if-match", default=None, metavar="ETAG", help="e.g. '\"3\"'")
    add_connection_options(set_cmd, nested=True)
    set_cmd.set_defaults(handler=set_tenant)


def _rows(tenants: list[TenantOut]) -> list[tuple[object, ...]]:
    return [(t.name, t.cohort, t.weight, ",".join(t.pools) or None, t.version) for t in tenants]


def list_tenants(args: argparse.Namespace) -> int:
    tenants = sorted(call(args, lambda p: p.tenants()), key=lambda t: t.name)
    if args.json:
        print_json(tenants)
        return 0
    print(table(HEADERS, _rows(tenants)))
    return 0


def set_tenant(args: argparse.Namespace) -> int:
    def change(portal: Portal) -> WithETag[TenantOut]:
        from policies.errors import NotFound

        try:
            read: WithETag[TenantOut] | None = portal.tenant(args.name)
        except NotFound:
            if args.if_match is not None:
                raise
            read = None
        # Options not given keep the tenant's current values (a PUT replaces them all).
        cohort, weight, pools = None, 1.0, list[str]()
        if read is not None:
            cohort, weight, pools = read.value.cohort, read.value.weight, read.value.pools
        if args.cohort is not None or args.no_cohort:
            cohort = args.cohort
        if args.pool is not None or args.no_pools:
            pools = args.pool or []
        return portal.set_tenant(
            args.name,
            cohort=cohort,
            weight=weight if args.weight is None else args.weight,
            pools=pools,
            if_match=args.if_match or (read.etag if read else None),
            create=read is None,
        )

    result: WithETag[TenantOut] = call(args, change)
    if args.json:
        print_json(result.value)
        return 0
    print(table(HEADERS, _rows([result.value])))
    return 0
