"""``gpuportal dashboards``: serve the dashboards as a JupyterHub service (HubOAuth), or, with
``--dev-identities``, on loopback for development with tokens from a file."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from portal.dashboard_views import DASHBOARD_VIEWS


def _run(args: argparse.Namespace) -> int:
    # Panel and HoloViews load only when the command runs.
    from dashboards.app import Settings, serve, serve_hub_service
    from dashboards.auth import TokenArgIdentity
    from portal.client.config import resolve_url

    url = resolve_url(args.portal_url)
    if args.dev_identities is None:
        serve_hub_service(url, refresh_s=args.refresh)
        return 0
    identify = TokenArgIdentity.from_file(args.dev_identities)
    print(
        f"DEVELOPMENT MODE: viewers from {args.dev_identities} by ?token=; "
        f"http://{args.address}:{args.port}/?token=<token>",
        flush=True,
    )
    serve(Settings(url, identify, args.refresh), address=args.address, port=args.port)
    return 0


def _titles() -> str:
    *first, last = (view.title for view in DASHBOARD_VIEWS)
    return f"{', '.join(first)} and {last}"


def register(commands: Any) -> None:
    """Add the ``dashboards`` subcommand to the CLI's subparsers."""
    cmd = commands.add_parser(
        "dashboards",
        help="serve the dashboards (a JupyterHub service behind HubOAuth)",
        description=(
            f"Serve {_titles()}. Run by JupyterHub as a managed service: "
            "it listens on JUPYTERHUB_SERVICE_URL under JUPYTERHUB_SERVICE_PREFIX and sends "
            "people through the hub's OAuth; every page reads the portal with the viewer's "
            "own token."
        ),
    )
    cmd.add_argument(
        "--portal-url", default=None, help="the portal API's root URL (default: GPUPORTAL_URL)"
    )
    cmd.add_argument(
        "--refresh", type=float, default=10.0, help="seconds between live updates (default 10)"
    )
    cmd.add_argument(
        "--dev-identities",
        type=Path,
        default=None,
        help=(
            "development only: a JSON file {token: {name, scopes, groups}}; pages then take "
            "the viewer from ?token= instead of HubOAuth. Off by default."
        ),
    )
    cmd.add_argument("--address", default="127.0.0.1", help="with --dev-identities: address")
    cmd.add_argument("--port", type=int, default=5006, help="with --dev-identities: port")
    cmd.set_defaults(handler=_run)
