"""``gpuportal elastic show TENANT`` (show a tenant's elastic-job policy) and ``gpuportal elastic
set TENANT`` (change it, guarded by its ETag)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from portal.commands.common import add_connection_options, call, print_json, table

if TYPE_CHECKING:
    from portal.api.schemas import ElasticOut
    from portal.client import Portal, WithETag

HEADERS = (
    "TENANT",
    "THRESHOLD",
    "WINDOW S",
    "IDLE S",
    "IDLE BELOW",
    "MIN THRESHOLD",
    "MIN WINDOW S",
    "MAX IDLE S",
    "VERSION",
)
_SETTINGS = ("threshold", "window_s", "idle_s", "idle_below")
_LIMITS = ("min_threshold", "min_window_s", "max_idle_s")


def register(commands: Any) -> None:
    """Add ``elastic`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "elastic",
        help="a tenant's elastic-job policy: `elastic show`, `elastic set`",
        description=(
            "When the tenant's elastic training jobs add a member (utilization at or above "
            "the threshold for the window) and give back a slice (idle for idle seconds), "
            "and the limits a platform admin set for the tenant's own admins (docs/jobs.md)."
        ),
    )
    add_connection_options(parser)
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    show_cmd = actions.add_parser("show", help="show a tenant's elastic-job policy")
    show_cmd.add_argument("tenant", help="the tenant (JupyterHub group)")
    add_connection_options(show_cmd, nested=True)
    show_cmd.set_defaults(handler=show)
    set_cmd = actions.add_parser(
        "set",
        help="change a tenant's elastic-job policy (values not given are kept)",
        description=(
            "Reads the current policy, replaces the values given, and writes it back guarded "
            "by the ETag read (or --if-match). Needs scope quotas:write for the tenant; a "
            "tenant admin stays within the platform admin's limits, which only a platform "
            "admin sets (--min-threshold, --min-window-s, --max-idle-s)."
        ),
    )
    set_cmd.add_argument("tenant", help="the tenant (JupyterHub group)")
    for name, what in (
        ("threshold", "grow at or above this utilization (a fraction, 0..1)"),
        ("window-s", "... held for this many seconds"),
        ("idle-s", "give back a slice idle this many seconds"),
        ("idle-below", "idle: utilization below this fraction"),
        ("min-threshold", "platform admins: the lowest threshold the tenant's admins may set"),
        ("min-window-s", "platform admins: the shortest window they may set"),
        ("max-idle-s", "platform admins: the longest idle time they may set"),
    ):
        set_cmd.add_argument(f"--{name}", type=float, default=None, help=what)
    set_cmd.add_argument("--if-match", default=None, metavar="ETAG", help="e.g. '\"3\"'")
    add_connection_options(set_cmd, nested=True)
    set_cmd.set_defaults(handler=set_policy)


def _row(e: ElasticOut) -> tuple[object, ...]:
    lim = e.limits
    return (
        e.tenant,
        e.threshold,
        e.window_s,
        e.idle_s,
        e.idle_below,
        lim.min_threshold,
        lim.min_window_s,
        lim.max_idle_s,
        e.version,
    )


def _print(args: argparse.Namespace, e: ElasticOut) -> int:
    if args.json:
        print_json(e)
    else:
        print(table(HEADERS, [_row(e)]))
    return 0


def show(args: argparse.Namespace) -> int:
    found: WithETag[ElasticOut] = call(args, lambda p: p.elastic(args.tenant))
    return _print(args, found.value)


def set_policy(args: argparse.Namespace) -> int:
    from portal.api.schemas import ElasticIn, ElasticLimitsIO

    def change(portal: Portal) -> WithETag[ElasticOut]:
        current = portal.elastic(args.tenant)
        settings = {k: getattr(args, k) for k in _SETTINGS if getattr(args, k) is not None}
        limits = {k: getattr(args, k) for k in _LIMITS if getattr(args, k) is not None}
        now = current.value
        body = ElasticIn(
            **{k: getattr(now, k) for k in _SETTINGS} | settings,
            limits=(ElasticLimitsIO(**now.limits.model_dump() | limits) if limits else None),
        )
        if_match = args.if_match or current.etag
        create = current.value.version == 0 and args.if_match is None
        return portal.set_elastic(
            args.tenant, body, if_match=None if create else if_match, create=create
        )

    result: WithETag[ElasticOut] = call(args, change)
    return _print(args, result.value)
