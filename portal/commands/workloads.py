"""``gpuportal workloads`` (list) and its actions ``request``, ``show``, ``release``, ``cancel``."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from policies.errors import InvalidRequest
from policies.requests import WorkloadKind
from portal.commands.common import add_connection_options, call, cell, print_json, table
from portal.store.records import WorkloadState
from portal.waits import eta_words

if TYPE_CHECKING:
    from portal.api.schemas import AllocationOut, DevicesIn, WorkloadOut
    from portal.client import Portal

LIVE_STATES = [s.value for s in WorkloadState if not s.terminal]
KINDS = [k.value for k in WorkloadKind]
HEADERS = ("ID", "TENANT", "OWNER", "NAME", "KIND", "STATE", "FLAVOR", "DEVICES", "REASON")


def register(commands: Any) -> None:
    """Add ``workloads`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "workloads",
        help="list live workloads; request, show, release or cancel one",
        description=(
            "Without an action: list live workloads (queued, running, preempting) the token "
            "may read, oldest first."
        ),
    )
    parser.add_argument("--tenant", help="only this tenant")
    parser.add_argument("--state", choices=LIVE_STATES, help="only this state")
    add_connection_options(parser)
    parser.set_defaults(handler=list_workloads)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    req = actions.add_parser(
        "request",
        help="ask for GPUs: allocated now, or queued with reason, position and ETA",
        description=(
            "Request devices charged to TENANT. FLAVOR is a whole-GPU model (H100-80GB, with "
            "--count), a MIG profile (H100-80GB/3g.40gb) or a share (T4/share, with --milli); "
            "or --option KEY asks for one of `gpuportal offers TENANT` (what the spawn page "
            "offers). "
            "Prints the workload: running with its devices, or queued with why. A retry with "
            "the same --idempotency-key allocates once. With --wait the exit code is 0 only if "
            "it runs by then."
        ),
    )
    req.add_argument("tenant", help="the tenant charged (you must be a member)")
    req.add_argument("flavor", nargs="?", help="H100-80GB, H100-80GB/3g.40gb, T4/share, ...")
    req.add_argument("--option", default=None, metavar="KEY", help="an offer's key, e.g. cpu")
    req.add_argument("--count", type=int, default=1, help="whole GPUs per member (default 1)")
    req.add_argument("--milli", type=int, default=0, help="share of one GPU, 1..999 (share)")
    req.add_argument("--gpu-memory-mib", type=int, default=0, help="GPU memory of a share, MiB")
    req.add_argument("--name", default=None, help="a name for people (default: the kind)")
    req.add_argument("--kind", choices=KINDS, default="notebook", help="what it runs")
    req.add_argument("--priority", type=int, default=0, help="higher goes first in the tenant")
    req.add_argument("--gang-size", type=int, default=1, help="members started all-or-nothing")
    req.add_argument("--duration", type=float, default=None, help="expected run time, seconds")
    req.add_argument("--idempotency-key", default=None, help="retries with it allocate once")
    req.add_argument(
        "--wait",
        type=float,
        default=None,
        metavar="SECONDS",
        help="if queued, wait up to this long for it to start; exit 1 if it did not",
    )
    add_connection_options(req, nested=True)
    req.set_defaults(handler=request_workload)

    for name, handler, text in (
        ("show", show_workload, "one workload, ended ones included"),
        ("release", release_workload, "give back its devices (idempotent)"),
        ("cancel", cancel_workload, "take a queued workload out of the queue (idempotent)"),
    ):
        cmd = actions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        cmd.add_argument("workload_id", metavar="ID", help="the workload's id")
        add_connection_options(cmd, nested=True)
        cmd.set_defaults(handler=handler)


def devices(allocations: list[AllocationOut]) -> str | None:
    """``n1:0,1`` for whole GPUs, ``n1:2/3g.40gb`` for MIG, ``t1:0@250m`` for a share."""
    shown = []
    for a in allocations:
        where = f"{a.node}:{','.join(str(g) for g in a.gpus)}"
        if a.mig_profile:
            where += f"/{a.mig_profile}"
        elif a.milli < 1000:
            where += f"@{a.milli}m"
        shown.append(where)
    return " ".join(shown) or None


def describe(w: WorkloadOut) -> str:
    """A workload as aligned ``key  value`` lines, for people."""
    pairs: list[tuple[str, object]] = [
        ("id", w.id),
        ("tenant", w.tenant),
        ("owner", w.owner),
        ("name", w.name),
        ("kind", w.kind),
        ("state", w.state.value),
    ]
    if w.reason:
        pairs.append(("reason", f"{w.reason}: {w.message}" if w.message else w.reason))
    if w.position is not None:
        pairs.append(("position", f"{w.position} ({w.tenant_position} in {w.tenant})"))
        pairs.append(("eta", eta_words(w.eta_s, w.eta_low_s, w.eta_high_s)))
        if w.eta_reason:
            pairs.append(("why", w.eta_reason))
    pairs += [("flavor", w.flavor), ("created", w.created_at), ("started", w.started_at)]
    pairs.append(("ended", w.ended_at))
    if w.preempt_deadline is not None:
        pairs.append(("preempted at", w.preempt_deadline))
    for a in w.allocations:
        borrowed = ", borrowed" if a.borrowed else ""
        pairs.append((f"member {a.member}", f"{devices([a])}  {a.amount} {a.flavor}{borrowed}"))
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {cell(v)}" for k, v in pairs)


def _print_one(args: argparse.Namespace, w: WorkloadOut) -> int:
    if args.json:
        print_json(w)
    else:
        print(describe(w))
    return 0


def _row(w: WorkloadOut) -> tuple[object, ...]:
    return (
        *(w.id, w.tenant, w.owner, w.name, w.kind, w.state.value, w.flavor),
        *(devices(w.allocations), w.reason or None),
    )


def list_workloads(args: argparse.Namespace) -> int:
    found = call(args, lambda p: p.workloads(args.tenant, args.state))
    rows = sorted(found, key=lambda w: (w.created_at, w.id))
    if args.json:
        print_json(rows)
        return 0
    print(table(HEADERS, [_row(w) for w in rows]))
    return 0


def _offered(portal: Portal, tenant: str, key: str) -> DevicesIn:
    """The devices of the offer ``key`` (as the spawn page would request them)."""
    offers = {o.key: o.devices for o in portal.offers(tenant)}
    if key not in offers:
        raise InvalidRequest("--option", repr(key), f"one of {', '.join(sorted(offers))}")
    return offers[key]


def request_workload(args: argparse.Namespace) -> int:
    if (args.flavor is None) == (args.option is None):
        raise InvalidRequest(
            "FLAVOR",
            f"{args.flavor or 'missing'} with --option {args.option}" if args.option else "missing",
            "either a flavor (H100-80GB, H100-80GB/3g.40gb, T4/share) or --option KEY",
        )

    def ask(portal: Portal) -> WorkloadOut:
        devices = None if args.option is None else _offered(portal, args.tenant, args.option)
        w = portal.request(
            args.tenant,
            args.flavor,
            devices=devices,
            count=args.count,
            milli=args.milli,
            gpu_memory_mib=args.gpu_memory_mib,
            name=args.name,
            kind=WorkloadKind(args.kind),
            priority=args.priority,
            gang_size=args.gang_size,
            expected_duration_s=args.duration,
            idempotency_key=args.idempotency_key,
        )
        return w if args.wait is None else portal.wait(w.id, timeout_s=args.wait)

    w = call(args, ask)
    _print_one(args, w)
    return 1 if args.wait is not None and w.state is not WorkloadState.RUNNING else 0


def show_workload(args: argparse.Namespace) -> int:
    return _print_one(args, call(args, lambda p: p.status(args.workload_id)))


def release_workload(args: argparse.Namespace) -> int:
    return _print_one(args, call(args, lambda p: p.release(args.workload_id)))


def cancel_workload(args: argparse.Namespace) -> int:
    return _print_one(args, call(args, lambda p: p.cancel(args.workload_id)))
