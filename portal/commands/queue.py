"""``gpuportal queue``: pending workloads in scheduling order, each with why it waits."""

from __future__ import annotations

import argparse
from typing import Any

from portal.commands.common import add_connection_options, call, print_json, table
from portal.waits import eta_words


def register(commands: Any) -> None:
    """Add ``queue`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "queue",
        help="pending workloads in scheduling order, with reason and ETA",
        description=(
            "The queue in the order the allocator will consider it. POS is the overall "
            "position, IN-TENANT the position among the tenant's own; REASON is quota, "
            "capacity, topology or budget; ETA '-' means it cannot be estimated."
        ),
    )
    parser.add_argument("--tenant", help="only this tenant")
    add_connection_options(parser)
    parser.set_defaults(handler=show_queue)


def show_queue(args: argparse.Namespace) -> int:
    entries = sorted(call(args, lambda p: p.queue(args.tenant)), key=lambda e: e.position)
    if args.json:
        print_json(entries)
        return 0
    headers = (
        *("POS", "IN-TENANT", "WORKLOAD", "TENANT", "OWNER", "NAME", "PRIORITY"),
        *("GPU-EQ", "REASON", "ETA", "QUEUED SINCE", "MESSAGE"),
    )
    rows = [
        (
            e.position,
            e.tenant_position,
            e.workload_id,
            e.tenant,
            e.owner,
            e.name,
            e.priority,
            e.gpu_equivalent,
            e.reason,
            eta_words(e.eta_s, e.eta_low_s, e.eta_high_s),
            e.enqueued_at,
            e.message,
        )
        for e in entries
    ]
    print(table(headers, rows, empty="(the queue is empty)"))
    return 0
