"""The ``gpuportal`` subcommands over the REST API, one module per noun.

Each is a thin layer over ``portal.client``: it parses arguments, calls the client and prints a
table (or ``--json``); the rules stay on the server, and ``PortalError`` reaches
``portal.cli.run``, which prints the server's message and exits 2.
"""

from __future__ import annotations

from typing import Any

from portal.commands import (
    alerts,
    cost,
    elastic,
    jobs,
    nodes,
    offers,
    queue,
    quotas,
    ray,
    services,
    tenants,
    usage,
    workloads,
)

NOUNS = (
    tenants,
    quotas,
    elastic,
    workloads,
    jobs,
    services,
    ray,
    queue,
    usage,
    cost,
    offers,
    nodes,
    alerts,
)


def register(commands: Any) -> None:
    """Add every noun to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    for noun in NOUNS:
        noun.register(commands)
