"""The ``gpuportal serve`` subcommand: its arguments, and its handler (imports stay lazy so
other subcommands start fast)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any


def register(commands: Any) -> None:
    """Add ``serve`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    cmd = commands.add_parser(
        "serve",
        help="run the portal service: the REST API, the allocator and its loops",
        description=(
            "Run the portal service until SIGTERM or Ctrl-C. Settings come from GPUPORTAL_* "
            "environment variables (see docs/service.md); under JupyterHub it listens on "
            "JUPYTERHUB_SERVICE_URL, answers under JUPYTERHUB_SERVICE_PREFIX and checks tokens "
            "with the hub. The flags below win over both."
        ),
    )
    cmd.add_argument(
        "--seed",
        type=Path,
        default=None,
        metavar="FILE",
        help="YAML of tenants and quotas per flavor to apply at start (idempotent)",
    )
    cmd.add_argument("--ip", default=None, help="listen address (GPUPORTAL_SERVICE_IP)")
    cmd.add_argument("--port", type=int, default=None, help="port (GPUPORTAL_SERVICE_PORT)")
    cmd.add_argument("--prefix", default=None, help="URL path prefix, e.g. /services/gpuportal/")
    cmd.add_argument(
        "--inventory",
        default=None,
        help="demo | preset:NAME=COUNT[,...] | file:PATH | kubernetes | nvml",
    )
    cmd.add_argument("--tokens-file", type=Path, default=None, help="YAML of static API tokens")
    cmd.add_argument("--database-url", default=None, help="SQLAlchemy URL of the database")
    cmd.set_defaults(handler=serve)


def serve(args: argparse.Namespace) -> int:
    from portal.service.server import serve as run_service
    from portal.settings import load_settings

    settings = load_settings(
        service_ip=args.ip,
        service_port=args.port,
        service_prefix=args.prefix,
        inventory=args.inventory,
        tokens_file=args.tokens_file,
        database_url=args.database_url,
    )
    return run_service(settings, seed_file=args.seed)
