"""``gpuportal offers TENANT``: what the tenant could ask for now, and what would happen."""

from __future__ import annotations

import argparse
from typing import Any

from portal.commands.common import add_connection_options, call, print_json, table
from portal.waits import eta_words


def register(commands: Any) -> None:
    """Add ``offers`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "offers",
        help="every GPU option for a tenant: available now, queued (why, ETA) or not allowed",
        description=(
            "The options the spawn page offers, decided now without changing anything: "
            "available (would start now), queued (reason, position, ETA) or not_allowed "
            "(no quota, over limit, not in pool). KEY names the option: "
            "gpu:MODEL:COUNT, mig:MODEL:PROFILE, share:MODEL:MILLI or cpu."
        ),
    )
    parser.add_argument("tenant", help="the tenant (JupyterHub group)")
    add_connection_options(parser)
    parser.set_defaults(handler=show_offers)


def show_offers(args: argparse.Namespace) -> int:
    offers = sorted(call(args, lambda p: p.offers(args.tenant)), key=lambda o: o.key)
    if args.json:
        print_json(offers)
        return 0
    headers = ("KEY", "OPTION", "STATE", "REASON", "POSITION", "ETA", "MESSAGE")
    rows = [
        (
            o.key,
            o.label,
            o.state.value,
            o.reason or None,
            o.position,
            eta_words(o.eta_s) if o.state.value == "queued" else None,
            o.message or None,
        )
        for o in offers
    ]
    print(table(headers, rows))
    return 0
