"""The ``gpuportal`` command line.

``run`` parses arguments and dispatches to one handler per subcommand; ``main`` is the only
place that exits the process. A ``PortalError`` becomes its exit code from
``portal.errors.ERRORS`` (2 for every one today, the code argparse uses for a malformed command
line) with its message on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib.metadata import PackageNotFoundError, version

from dashboards.command import register as register_dashboards
from portal.agent import command as agent_command
from portal.commands import register as register_api_commands
from portal.errors import PortalError, exit_code_of
from portal.hubroles_command import register as register_hub_roles
from portal.service import command as service_command
from portal.store import command as store_command

EXIT_OK = 0

Handler = Callable[[argparse.Namespace], int]


def package_version() -> str:
    """The installed gpuportal version, or ``unknown`` when run from an uninstalled tree."""
    try:
        return version("gpuportal")
    except PackageNotFoundError:
        return "unknown"


def _version(_args: argparse.Namespace) -> int:
    print(f"gpuportal {package_version()}")
    return EXIT_OK


def _demo(args: argparse.Namespace) -> int:
    # Imported here so `gpuportal version` stays fast and works without the hub installed.
    from portal import demo
    from portal.settings import load_settings

    settings = load_settings(demo_port=args.port, demo_ip=args.ip)
    plan = demo.prepare(settings)
    print(demo.banner(plan), flush=True)
    print(demo.inventory_summary(), flush=True)
    print(f"state in {plan.state_dir}; stop with Ctrl-C", flush=True)
    return demo.run_hub(plan)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser; each subcommand stores its handler as ``handler``."""
    parser = argparse.ArgumentParser(
        prog="gpuportal",
        description="Jupyter-native, multi-tenant GPU portal.",
    )
    # The flag as well as the subcommand: image and packaging checks expect `--version`.
    parser.add_argument("--version", action="version", version=f"gpuportal {package_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    version_cmd = commands.add_parser("version", help="print the gpuportal version")
    version_cmd.set_defaults(handler=_version)

    demo_cmd = commands.add_parser(
        "demo",
        help="run the portal on this machine with demo tenants and users (Ctrl-C stops it)",
        description=(
            "Run JupyterHub on SQLite with demo tenants team-a and team-b, users alice, bob "
            "and carol (admin), and JupyterLab servers started as local processes. State goes "
            "to GPUPORTAL_STATE_DIR (default .run/demo under the current directory)."
        ),
    )
    demo_cmd.add_argument(
        "--port", type=int, default=None, help="public port (default: GPUPORTAL_DEMO_PORT or 8000)"
    )
    demo_cmd.add_argument(
        "--ip", default=None, help="public address (default: GPUPORTAL_DEMO_IP or 127.0.0.1)"
    )
    demo_cmd.set_defaults(handler=_demo)
    service_command.register(commands)
    store_command.register(commands)
    agent_command.register(commands)
    register_hub_roles(commands)
    register_api_commands(commands)
    register_dashboards(commands)
    return parser


def run(argv: Sequence[str] | None = None) -> int:
    """Run one command and return its exit code; an error of the portal, its ``exit_code_of``."""
    given = list(sys.argv[1:] if argv is None else argv)
    # ``-- PROGRAM ARGS`` (``jobs submit``) is split off first: argparse loses a ``--`` met
    # inside nested subcommands.
    program: list[str] | None = None
    if "--" in given:
        at = given.index("--")
        given, program = given[:at], given[at + 1 :]
    parser = build_parser()
    args = parser.parse_args(given)
    if program is not None:
        if not hasattr(args, "program"):
            parser.error("-- PROGRAM ARGS... is taken by `gpuportal jobs submit` only")
        args.program = program
    handler: Handler = args.handler
    try:
        return handler(args)
    except PortalError as exc:
        print(f"gpuportal {args.command}: error: {exc.message}", file=sys.stderr)
        return exit_code_of(exc)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``gpuportal`` console script."""
    sys.exit(run(argv))


if __name__ == "__main__":
    main()
