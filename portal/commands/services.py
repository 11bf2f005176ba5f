"""``gpuportal services`` (list) and its actions ``deploy``, ``show``, ``scale``, ``cache``,
``logs``, ``delete``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from portal.commands.common import add_connection_options, call, cell, print_json, table
from portal.commands.jobs import _env
from portal.inference.spec import Preset

if TYPE_CHECKING:
    from portal.api.services import ServiceOut

HEADERS = ("ID", "TENANT", "NAME", "STATE", "DESIRED", "READY", "REPLICAS", "GATEWAY")


def register(commands: Any) -> None:
    """Add ``services`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "services",
        help="list inference services; deploy one, show it, scale it, read its logs, delete it",
        description="Without an action: list the services the token may read, oldest first.",
    )
    parser.add_argument("--tenant", help="only this tenant")
    add_connection_options(parser)
    parser.set_defaults(handler=list_services)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    sub = actions.add_parser(
        "deploy",
        help="deploy a service: replicas of an engine behind the portal's OpenAI gateway",
        description=(
            "Deploy NAME charged to TENANT (gpuportal services deploy team-a llm H100-80GB "
            "--model-uri file:///models/tiny --digest sha256:...): replicas of --preset, each "
            "with --count GPUs of FLAVOR (or one MIG instance, or a --milli share). Prints the "
            "service; call it at its gateway path with your token as the API key."
        ),
    )
    sub.add_argument("tenant", help="the tenant charged (you must be a member)")
    sub.add_argument("name", help="the service's name: its model id and URL part")
    sub.add_argument("flavor", help="H100-80GB, H100-80GB/3g.40gb, T4/share, ...")
    sub.add_argument("--model-uri", required=True, help="file:///..., https://..., hf://...")
    sub.add_argument("--digest", required=True, help="sha256:<64 hex digits>")
    sub.add_argument("--preset", choices=[p.value for p in Preset], default="vllm")
    sub.add_argument("--arg", action="append", default=[], help="an engine argument (repeatable)")
    sub.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="repeatable")
    sub.add_argument("--count", type=int, default=1, help="whole GPUs per replica (default 1)")
    sub.add_argument("--milli", type=int, default=0, help="share of one GPU, 1..999 (share)")
    sub.add_argument("--min", type=int, default=1, dest="min_replicas", help="0: scale to zero")
    sub.add_argument("--max", type=int, default=1, dest="max_replicas", help=">= --min")
    sub.add_argument("--idle", type=float, default=600.0, help="idle seconds before zero")
    sub.add_argument("--target", type=float, default=4.0, help="waiting requests per replica")
    sub.add_argument("--priority", type=int, default=0, help="higher goes first in the tenant")
    add_connection_options(sub, nested=True)
    sub.set_defaults(handler=deploy_service)

    for name, handler, text in (
        ("show", show_service, "one service, deleted ones included"),
        ("delete", delete_service, "stop its replicas and release their devices (idempotent)"),
    ):
        cmd = actions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        cmd.add_argument("service_id", metavar="ID", help="the service's id")
        add_connection_options(cmd, nested=True)
        cmd.set_defaults(handler=handler)

    scale = actions.add_parser("scale", help="new replica bounds", description="New bounds.")
    scale.add_argument("service_id", metavar="ID", help="the service's id")
    scale.add_argument("--min", type=int, default=None, dest="min_replicas")
    scale.add_argument("--max", type=int, default=None, dest="max_replicas")
    add_connection_options(scale, nested=True)
    scale.set_defaults(handler=scale_service)

    text = "the weight cache: models per node and tenant, their size, last use and whether in use"
    cache = actions.add_parser("cache", help=text, description=text[0].upper() + text[1:] + ".")
    cache.add_argument("--tenant", default=argparse.SUPPRESS, help="only this tenant")
    cache.add_argument("--node", help="only this node")
    add_connection_options(cache, nested=True)
    cache.set_defaults(handler=show_cache)

    logs = actions.add_parser("logs", help="a replica's engine log", description="A log.")
    logs.add_argument("service_id", metavar="ID", help="the service's id")
    logs.add_argument("--replica", type=int, default=1, help="the replica's number (default 1)")
    add_connection_options(logs, nested=True)
    logs.set_defaults(handler=show_logs)


def describe(s: ServiceOut) -> str:
    pairs: list[tuple[str, object]] = [
        ("id", s.id),
        ("tenant", s.tenant),
        ("owner", s.owner),
        ("name", s.name),
        ("state", s.state.value),
        ("message", s.message),
        ("replicas", f"{s.ready} ready of {s.desired} wanted"),
        ("gateway", s.gateway),
    ]
    for r in s.replicas:
        where = f"{r.node}:{','.join(r.devices)} port {r.port}" if r.node else ""
        w = r.workload
        why = f" ({w.reason}: {w.message})" if w is not None and w.reason else ""
        pairs.append((f"replica {r.number}", f"{r.state.value} {where}{why}".strip()))
    t = s.traffic
    pairs.append(("traffic", f"served {t['served']}, held {t['held']}, refused {t['refused']}"))
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {cell(v)}" for k, v in pairs)


def _print_one(args: argparse.Namespace, s: ServiceOut) -> int:
    if args.json:
        print_json(s)
    else:
        print(describe(s))
    return 0


def list_services(args: argparse.Namespace) -> int:
    found = call(args, lambda p: [s.info for s in p.services.list(args.tenant)])
    if args.json:
        print_json(found)
        return 0
    rows = [
        (s.id, s.tenant, s.name, s.state.value, s.desired, s.ready, len(s.replicas), s.gateway)
        for s in found
    ]
    print(table(HEADERS, rows))
    return 0


def deploy_service(args: argparse.Namespace) -> int:
    info = call(
        args,
        lambda p: (
            p.services.deploy(
                args.tenant,
                args.name,
                model_uri=args.model_uri,
                digest=args.digest,
                flavor=args.flavor,
                count=args.count,
                milli=args.milli,
                preset=args.preset,
                args=args.arg,
                env=_env(args.env),
                min_replicas=args.min_replicas,
                max_replicas=args.max_replicas,
                scaling={"idle_s": args.idle, "target": args.target},
                priority=args.priority,
            ).info
        ),
    )
    return _print_one(args, info)


def show_service(args: argparse.Namespace) -> int:
    return _print_one(args, call(args, lambda p: p.services.get(args.service_id).info))


def delete_service(args: argparse.Namespace) -> int:
    return _print_one(args, call(args, lambda p: p.services.delete(args.service_id)))


def scale_service(args: argparse.Namespace) -> int:
    return _print_one(
        args,
        call(
            args,
            lambda p: p.services.scale(
                args.service_id, min_replicas=args.min_replicas, max_replicas=args.max_replicas
            ),
        ),
    )


def show_logs(args: argparse.Namespace) -> int:
    text = call(args, lambda p: p.services.get(args.service_id).logs(args.replica))
    sys.stdout.write(text)
    return 0


CACHE_HEADERS = ("NODE", "TENANT", "DIGEST", "BYTES", "LAST USED", "IN USE")


def show_cache(args: argparse.Namespace) -> int:
    found = call(args, lambda p: p.services.cache(args.tenant, args.node))
    if args.json:
        print_json(found)
        return 0
    rows = [
        (e.node, e.tenant, e.digest[:19], e.size_bytes, e.last_used, "yes" if e.in_use else "no")
        for e in found
    ]
    print(table(CACHE_HEADERS, rows))
    return 0
