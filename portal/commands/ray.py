"""``gpuportal ray`` (list) and its actions ``up``, ``scale``, ``resume``, ``down``; the Ray
job actions (``submit``, ``jobs``, ``stop``, ``logs``) are in ``portal.commands.ray_jobs``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from portal.commands import ray_jobs
from portal.commands.common import add_connection_options, call, print_json, table
from portal.commands.workloads import devices

if TYPE_CHECKING:
    from portal.api.ray import RayOut
    from portal.client import Portal

HEADERS = ("ID", "TENANT", "OWNER", "NAME", "STATE", "WORKERS", "JOINED", "ADDRESS", "MESSAGE")


def register(commands: Any) -> None:
    """Add ``ray`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "ray",
        help="list Ray clusters; bring one up, scale it, take it down; submit Ray jobs",
        description="Without an action: list the Ray clusters the token may read, oldest first.",
    )
    parser.add_argument("--tenant", help="only this tenant")
    add_connection_options(parser)
    parser.set_defaults(handler=list_clusters)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    sub = actions.add_parser(
        "up",
        help="create a Ray cluster: head + --workers workers admitted as one gang",
        description=(
            "Create a Ray cluster charged to TENANT with --workers workers, each with --count "
            "GPUs of FLAVOR, growing up to --max-workers. Waits until the head is up and the "
            "workers have joined (--no-wait: at once) and prints the address for ray.init."
        ),
    )
    sub.add_argument("tenant", help="the tenant charged (you must be a member)")
    sub.add_argument("flavor", help="H100-80GB, H100-80GB/3g.40gb, T4/share, ...")
    sub.add_argument("--workers", type=int, default=1, help="workers admitted with the head")
    sub.add_argument("--max-workers", type=int, default=None, help="the most (default --workers)")
    sub.add_argument("--count", type=int, default=1, help="whole GPUs per worker (default 1)")
    sub.add_argument("--milli", type=int, default=0, help="share of one GPU, 1..999 (share)")
    sub.add_argument("--name", default=None, help="a name for people (default: ray)")
    sub.add_argument(
        "--idle-s",
        type=float,
        default=None,
        help="release the workers after this many seconds with nothing running (default: never)",
    )
    sub.add_argument(
        "--idle-suspend", action="store_true", help="when idle, stop the head too (suspended)"
    )
    sub.add_argument(
        "--autoscale",
        action="store_true",
        help="grow on unmet GPU demand, up to --max-workers (each increase its own slice)",
    )
    sub.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    sub.add_argument("--no-wait", action="store_true", help="print the cluster and return")
    add_connection_options(sub)
    sub.set_defaults(handler=up)

    sub = actions.add_parser(
        "scale",
        help="set the worker count: an increase is a new charged slice, a decrease releases",
    )
    sub.add_argument("cluster_id")
    sub.add_argument("workers", type=int, help="workers wanted (min..max)")
    add_connection_options(sub)
    sub.set_defaults(handler=scale)

    sub = actions.add_parser(
        "resume",
        help="ask for an idle or suspended cluster's previous size again, through admission",
        description=(
            "Request the workers an idle (or suspended) cluster had; they may wait in the "
            "queue with a reason. Waits until it runs (--no-wait: at once)."
        ),
    )
    sub.add_argument("cluster_id")
    sub.add_argument("--timeout", type=float, default=600.0, help="seconds to wait (default 600)")
    sub.add_argument("--no-wait", action="store_true", help="print the cluster and return")
    add_connection_options(sub)
    sub.set_defaults(handler=resume)

    sub = actions.add_parser("down", help="stop every node and release every slice")
    sub.add_argument("cluster_id")
    add_connection_options(sub)
    sub.set_defaults(handler=down)
    ray_jobs.register(actions)


def describe(r: RayOut) -> str:
    lines = [
        f"id        {r.id}",
        f"tenant    {r.tenant}",
        f"state     {r.state.value}: {r.message}",
        f"address   {r.address or '-'}",
        f"workers   {r.joined} joined of {r.workers} wanted ({r.min_workers}..{r.max_workers})",
    ]
    for s in r.slices:
        where = devices(s.workload.allocations) if s.workload else None
        why = s.reason or (s.workload.message if s.workload and s.state.value == "queued" else "")
        lines.append(
            f"slice {s.number}   {s.workers} workers {s.state.value}"
            + (f" on {where}" if where else "")
            + (f": {why}" if why else "")
        )
    return "\n".join(lines)


def _print_one(args: argparse.Namespace, r: RayOut) -> int:
    if args.json:
        print_json(r)
    else:
        print(describe(r))
    return 0


def list_clusters(args: argparse.Namespace) -> int:
    found = call(args, lambda p: p.ray.list(args.tenant))
    if args.json:
        print_json(found)
        return 0
    rows = [
        (r.id, r.tenant, r.owner, r.name, r.state.value, r.workers, r.joined, r.address, r.message)
        for r in found
    ]
    print(table(HEADERS, rows))
    return 0


def up(args: argparse.Namespace) -> int:
    def go(portal: Portal) -> RayOut:
        info = portal.ray.create(
            args.tenant,
            workers=args.workers,
            max_workers=args.max_workers,
            flavor=args.flavor,
            count=args.count,
            milli=args.milli,
            name=args.name,
            idle_s=args.idle_s,
            idle_suspend=args.idle_suspend,
            autoscale=args.autoscale,
        )
        if not args.no_wait:
            portal.ray.wait(info.id, timeout_s=args.timeout)
            info = portal.ray.get(info.id)
        return info

    return _print_one(args, call(args, go))


def scale(args: argparse.Namespace) -> int:
    return _print_one(args, call(args, lambda p: p.ray.scale(args.cluster_id, args.workers)))


def resume(args: argparse.Namespace) -> int:
    def go(portal: Portal) -> RayOut:
        return portal.ray.resume(args.cluster_id, wait=not args.no_wait, timeout_s=args.timeout)

    return _print_one(args, call(args, go))


def down(args: argparse.Namespace) -> int:
    return _print_one(args, call(args, lambda p: p.ray.down(args.cluster_id)))
