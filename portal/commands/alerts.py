"""``gpuportal alerts``: alerts the portal raised (idle GPUs, noisy neighbours, XID, ...)."""

from __future__ import annotations

import argparse
from typing import Any

from portal.commands.common import add_connection_options, call, print_json, table


def register(commands: Any) -> None:
    """Add ``alerts`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "alerts",
        help="alerts: idle GPUs, noisy neighbours, memory over share, XID/ECC, quota pressure",
        description=(
            "Alerts newest first, pending, firing and resolved unless --state says otherwise. "
            "Operators see all, tenant admins their tenant's, members their own workloads'. "
            "Needs workloads:read."
        ),
    )
    parser.add_argument("--tenant", help="only this tenant")
    parser.add_argument(
        "--state", action="append", default=None, help="only this state (repeat for several)"
    )
    parser.add_argument("--rule", help="only this rule, e.g. idle or noisy_neighbour")
    add_connection_options(parser)
    parser.set_defaults(handler=show_alerts)


def show_alerts(args: argparse.Namespace) -> int:
    found = call(args, lambda p: p.alerts(args.tenant, states=args.state or (), rule=args.rule))
    alerts = sorted(found, key=lambda a: (a.active_since, a.id), reverse=True)
    if args.json:
        print_json(alerts)
        return 0
    headers = ("SINCE", "STATE", "RULE", "TENANT", "OWNER", "SUBJECT", "VALUE", "SUMMARY")
    rows = [
        (a.active_since, str(a.state), a.rule, a.tenant, a.owner, a.subject, a.value, a.summary)
        for a in alerts
    ]
    print(table(headers, rows, empty="(no alerts)"))
    return 0
