"""``gpuportal nodes``: the inventory, one line per node."""

from __future__ import annotations

import argparse
from typing import Any

from portal.commands.common import add_connection_options, call, print_json, table


def register(commands: Any) -> None:
    """Add ``nodes`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "nodes",
        help="nodes with their GPUs, free capacity and MIG instances",
        description=(
            "One line per node: GPU models and count, FREE (unallocated GPU share, in "
            "GPU-equivalents), MIG instances free/total, pool, rack and whether it is "
            "schedulable. --json has everything, topology included. Needs inventory:read."
        ),
    )
    add_connection_options(parser)
    parser.set_defaults(handler=show_nodes)


def show_nodes(args: argparse.Namespace) -> int:
    nodes = sorted(call(args, lambda p: p.nodes()), key=lambda n: n.name)
    if args.json:
        print_json(nodes)
        return 0
    headers = ("NODE", "MODELS", "GPUS", "FREE", "MIG FREE/ALL", "POOL", "RACK", "SCHEDULABLE")
    rows = []
    for n in nodes:
        mig = [m for g in n.gpus for m in g.mig_layout]
        rows.append(
            (
                *(n.name, ",".join(sorted({g.model for g in n.gpus})) or None, len(n.gpus)),
                sum(g.free_milli for g in n.gpus) / 1000,
                f"{sum(m.free for m in mig)}/{len(mig)}" if mig else None,
                *(n.pool or None, n.rack or None, n.schedulable),
            )
        )
    print(table(headers, rows))
    return 0
