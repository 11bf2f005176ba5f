"""``gpuportal ray submit`` and the other Ray job actions: ``jobs``, ``job``, ``stop``,
``logs`` (registered under ``gpuportal ray``)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from policies.errors import InvalidRequest
from portal.commands.common import add_connection_options, call, print_json, table

if TYPE_CHECKING:
    from portal.api.ray_jobs import RayJobOut
    from portal.client import Portal

HEADERS = ("ID", "TENANT", "OWNER", "CLUSTER", "ONE-OFF", "STATE", "ATTEMPT", "MESSAGE")


def register(actions: Any) -> None:
    """Add the Ray job actions to ``gpuportal ray``'s subparsers."""
    sub = actions.add_parser(
        "submit",
        help="run an entrypoint on a Ray cluster, or on a one-off cluster of its own",
        description=(
            "Run ENTRYPOINT (a shell command line; RAY_ADDRESS is set, so ray.init() joins the "
            "cluster) on --cluster, or, with --tenant and --flavor, on a one-off cluster that "
            "is admitted like any Ray cluster and deleted when the job ends. Waits until the "
            "job ends and prints its output (--no-wait: prints the job and returns)."
        ),
    )
    sub.add_argument("entrypoint", help="e.g. 'python train.py --epochs 3'")
    sub.add_argument("--cluster", default=None, help="the cluster's id (else: one-off)")
    sub.add_argument("--tenant", default=None, help="one-off: the tenant charged")
    sub.add_argument("--flavor", default=None, help="one-off: each worker's GPUs, H100-80GB...")
    sub.add_argument("--workers", type=int, default=1, help="one-off: workers (default 1)")
    sub.add_argument("--count", type=int, default=1, help="one-off: GPUs per worker (default 1)")
    sub.add_argument("--priority", type=int, default=0, help="one-off: within the tenant's quota")
    sub.add_argument("--working-dir", default=None, help="a directory on the portal's host")
    sub.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="repeatable")
    sub.add_argument(
        "--metadata", action="append", default=[], metavar="KEY=VALUE", help="repeatable"
    )
    sub.add_argument(
        "--timeout", type=float, default=None, help="seconds to wait (default: no limit)"
    )
    sub.add_argument("--no-wait", action="store_true", help="print the job and return")
    add_connection_options(sub)
    sub.set_defaults(handler=submit)

    sub = actions.add_parser("jobs", help="list Ray jobs, oldest first")
    sub.add_argument("--tenant", default=None, help="only this tenant")
    sub.add_argument("--cluster", default=None, help="only this cluster's")
    add_connection_options(sub)
    sub.set_defaults(handler=list_jobs)

    sub = actions.add_parser("stop", help="stop a Ray job (a one-off job's cluster with it)")
    sub.add_argument("job_id")
    add_connection_options(sub)
    sub.set_defaults(handler=stop)

    sub = actions.add_parser("logs", help="print a Ray job's driver output")
    sub.add_argument("job_id")
    sub.add_argument("--attempt", type=int, default=None, help="default: the current one")
    add_connection_options(sub)
    sub.set_defaults(handler=logs)


def pairs(values: list[str], what: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for v in values:
        name, sep, value = v.partition("=")
        if not sep or not name:
            raise InvalidRequest(what, v, "NAME=VALUE")
        out[name] = value
    return out


def describe(j: RayJobOut) -> str:
    lines = [
        f"id        {j.id}",
        f"tenant    {j.tenant}",
        f"cluster   {j.cluster_id} ({'one-off, ' if j.one_off else ''}{j.cluster_state.value})",
        f"state     {j.state.value}: {j.message}",
        f"entry     {j.entrypoint}",
    ]
    for a in j.attempts:
        code = "-" if a.exit_code is None else a.exit_code
        lines.append(f"attempt {a.number} exit {code} {a.reason}".rstrip())
    return "\n".join(lines)


def _print_one(args: argparse.Namespace, j: RayJobOut) -> int:
    if args.json:
        print_json(j)
    else:
        print(describe(j))
    return 0


def _output(portal: Portal, job_id: str, attempt: int | None) -> str:
    text, offset = [], 0
    while True:
        chunk = portal.ray.job_logs(job_id, attempt=attempt, offset=offset)
        text.append(chunk.text)
        if chunk.next_offset == offset:
            return "".join(text)
        offset = chunk.next_offset


def submit(args: argparse.Namespace) -> int:
    def go(portal: Portal) -> tuple[RayJobOut, str]:
        info = portal.ray.submit(
            args.entrypoint,
            cluster_id=args.cluster,
            tenant=args.tenant,
            flavor=args.flavor,
            workers=args.workers,
            count=args.count,
            priority=args.priority,
            working_dir=args.working_dir,
            env_vars=pairs(args.env, "--env"),
            metadata=pairs(args.metadata, "--metadata"),
        )
        if args.no_wait:
            return info, ""
        info = portal.ray.wait_job(info.id, timeout_s=args.timeout)
        return info, _output(portal, info.id, None)

    info, output = call(args, go)
    if output and not args.json:
        print(output, end="" if output.endswith("\n") else "\n")
    _print_one(args, info)
    return 0 if args.no_wait or info.state.value == "succeeded" else 1


def list_jobs(args: argparse.Namespace) -> int:
    found = call(args, lambda p: p.ray.jobs(args.tenant, args.cluster))
    if args.json:
        print_json(found)
        return 0
    rows = [
        (j.id, j.tenant, j.owner, j.cluster_id, j.one_off, j.state.value, j.attempt, j.message)
        for j in found
    ]
    print(table(HEADERS, rows))
    return 0


def stop(args: argparse.Namespace) -> int:
    return _print_one(args, call(args, lambda p: p.ray.stop_job(args.job_id)))


def logs(args: argparse.Namespace) -> int:
    print(call(args, lambda p: _output(p, args.job_id, args.attempt)), end="")
    return 0
