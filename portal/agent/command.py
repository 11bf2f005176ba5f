"""The ``gpuportal agent`` subcommand: its arguments; the handler (``portal.agent.run``) is
imported on use so other subcommands start fast."""

from __future__ import annotations

import argparse
from typing import Any


def register(commands: Any) -> None:
    """Add ``agent`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "agent",
        help="run the node agent: sample this host's GPUs and report them to the portal",
        description=(
            "Discover this host's GPUs with NVML, then sample them every interval and send "
            "the samples to the portal API until SIGTERM or Ctrl-C. Settings come from "
            "GPUPORTAL_AGENT_* environment variables (see docs/agent.md); flags win."
        ),
    )
    parser.add_argument(
        "--demo",
        action="store_true",
        help="sample the bundled simulated inventory with synthetic values (no GPU needed)",
    )
    parser.add_argument("--portal-url", help="portal API base URL (GPUPORTAL_AGENT_PORTAL_URL)")
    parser.add_argument("--node", dest="node_name", help="node name (default: the host name)")
    parser.add_argument(
        "--interval", dest="interval_s", type=float, help="seconds between samples (default 10)"
    )
    parser.add_argument(
        "--kubernetes",
        action="store_true",
        default=None,
        help="write the topology annotation on the Node and attribute processes to pods",
    )
    parser.add_argument(
        "--prometheus",
        metavar="URL",
        help="read DCGM exporter metrics from this Prometheus instead of NVML "
        "(GPUPORTAL_AGENT_PROMETHEUS_URL)",
    )
    parser.add_argument("--once", action="store_true", help="sample once, send, and exit")
    parser.add_argument(
        "--stdout", action="store_true", help="print the batches as JSON lines instead of sending"
    )
    parser.set_defaults(handler=agent)


def agent(args: argparse.Namespace) -> int:
    from portal.agent.run import main

    return main(args)
