"""``gpuportal tenants``: the tenants the token may see."""

from __future__ import annotations

import argparse
from typing import Any

from portal.commands.common import add_connection_options, call, print_json, table


def register(commands: Any) -> None:
    """Add ``tenants`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "tenants",
        help="list tenants (JupyterHub groups) with cohort, weight and pools",
        description="List the tenants the token may read (scope quotas:read), by name.",
    )
    add_connection_options(parser)
    parser.set_defaults(handler=list_tenants)


def list_tenants(args: argparse.Namespace) -> int:
    tenants = sorted(call(args, lambda p: p.tenants()), key=lambda t: t.name)
    if args.json:
        print_json(tenants)
        return 0
    rows = [(t.name, t.cohort, t.weight, ",".join(t.pools) or None, t.version) for t in tenants]
    print(table(("TENANT", "COHORT", "WEIGHT", "POOLS", "VERSION"), rows))
    return 0
