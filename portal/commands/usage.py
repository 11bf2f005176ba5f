"""``gpuportal usage``: guaranteed, limit, used, borrowed and lent per tenant and flavor."""

from __future__ import annotations

import argparse
from typing import Any

from portal.commands.common import add_connection_options, call, print_json, table, unit_of


def register(commands: Any) -> None:
    """Add ``usage`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "usage",
        help="quota usage per tenant and flavor: used, borrowed, lent",
        description=(
            "Quota usage now, per tenant and flavor, in the flavor's unit (GPUs, MIG instances "
            "or milli-GPU). BORROWED: held above guaranteed (preemptible); LENT: unused "
            "guaranteed units cohort members use."
        ),
    )
    parser.add_argument("--tenant", help="only this tenant")
    add_connection_options(parser)
    parser.set_defaults(handler=show_usage)


def show_usage(args: argparse.Namespace) -> int:
    rows = sorted(call(args, lambda p: p.usage(args.tenant)), key=lambda u: (u.tenant, u.flavor))
    if args.json:
        print_json(rows)
        return 0
    headers = ("TENANT", "FLAVOR", "USED", "GUARANTEED", "LIMIT", "BORROWED", "LENT", "UNIT")
    print(
        table(
            headers,
            [
                (
                    u.tenant,
                    u.flavor,
                    u.used,
                    u.guaranteed,
                    u.limit,
                    u.borrowed,
                    u.lent,
                    unit_of(u.flavor),
                )
                for u in rows
            ],
        )
    )
    return 0
