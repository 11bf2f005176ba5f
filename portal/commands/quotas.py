"""``gpuportal quotas`` (list) and ``gpuportal quotas set`` (change one, guarded by its ETag)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from portal.commands.common import add_connection_options, call, print_json, table, unit_of

if TYPE_CHECKING:
    from portal.api.schemas import QuotaOut
    from portal.client import Portal, WithETag

HEADERS = ("TENANT", "FLAVOR", "GUARANTEED", "LIMIT", "UNIT", "BUDGET GPU-H/MONTH", "VERSION")


def register(commands: Any) -> None:
    """Add ``quotas`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "quotas",
        help="list quotas per tenant and flavor; `quotas set` changes one",
        description=(
            "Without an action: list the quotas the token may read, in the flavor's unit "
            "(GPUs, MIG instances or milli-GPU)."
        ),
    )
    parser.add_argument("--tenant", help="only this tenant")
    add_connection_options(parser)
    parser.set_defaults(handler=list_quotas)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    set_cmd = actions.add_parser(
        "set",
        help="set a tenant's quota for a flavor (creates it when missing)",
        description=(
            "Set guaranteed and limit (and optionally a monthly GPU-hour budget). With "
            "--if-match the change applies only if the quota is still at that ETag (as read "
            "by `quotas --json`: its version in quotes); without it the current ETag is read "
            "first, so the values given win. Needs scope quotas:write for the tenant; a tenant "
            "admin stays within the platform admin's ceilings (docs/quota.md)."
        ),
    )
    set_cmd.add_argument("tenant", help="the tenant (JupyterHub group)")
    set_cmd.add_argument("flavor", help="H100-80GB, H100-80GB/3g.40gb, T4/share, ...")
    set_cmd.add_argument("--guaranteed", type=int, required=True, help="units always obtainable")
    set_cmd.add_argument("--limit", type=int, required=True, help="units never exceeded")
    set_cmd.add_argument(
        "--budget-gpu-hours", type=float, default=None, help="GPU-hours per month (default none)"
    )
    set_cmd.add_argument(
        "--ceiling-guaranteed",
        type=int,
        default=None,
        help="platform admins: the most the tenant's admins may guarantee (default: kept)",
    )
    set_cmd.add_argument(
        "--ceiling-limit",
        type=int,
        default=None,
        help="platform admins: the most the tenant's admins may set as limit (default: kept)",
    )
    set_cmd.add_argument(
        "--overcommit",
        action="store_true",
        help="platform admins: allow guarantees adding up to more than the flavor's capacity",
    )
    set_cmd.add_argument("--if-match", default=None, metavar="ETAG", help="e.g. '\"3\"'")
    add_connection_options(set_cmd, nested=True)
    set_cmd.set_defaults(handler=set_quota)


def _rows(quotas: list[QuotaOut]) -> list[tuple[object, ...]]:
    return [
        (
            q.tenant,
            q.flavor,
            q.guaranteed,
            q.limit,
            unit_of(q.flavor),
            q.budget_gpu_hours,
            q.version,
        )
        for q in quotas
    ]


def list_quotas(args: argparse.Namespace) -> int:
    quotas = sorted(call(args, lambda p: p.quotas(args.tenant)), key=lambda q: (q.tenant, q.flavor))
    if args.json:
        print_json(quotas)
        return 0
    print(table(HEADERS, _rows(quotas)))
    return 0


def set_quota(args: argparse.Namespace) -> int:
    def change(portal: Portal) -> WithETag[QuotaOut]:
        from policies.errors import NotFound

        if_match, create = args.if_match, False
        if if_match is None:
            try:
                if_match = portal.quota(args.tenant, args.flavor).etag
            except NotFound:
                create = True  # an unknown tenant or flavor still answers 404 on the PUT
        return portal.set_quota(
            args.tenant,
            args.flavor,
            guaranteed=args.guaranteed,
            limit=args.limit,
            budget_gpu_hours=args.budget_gpu_hours,
            if_match=if_match,
            create=create,
            ceiling_guaranteed=args.ceiling_guaranteed,
            ceiling_limit=args.ceiling_limit,
            overcommit=args.overcommit,
        )

    result: WithETag[QuotaOut] = call(args, change)
    if args.json:
        print_json(result.value)
        return 0
    print(table(HEADERS, _rows([result.value])))
    return 0
