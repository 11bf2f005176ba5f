"""``gpuportal jobs`` (list) and its actions ``submit``, ``show``, ``logs``, ``cancel``,
``attempts``, ``cost``."""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from policies.errors import InvalidRequest
from policies.jobs import JobState, TopologyMode
from policies.requests import TopologyRequirement
from portal.commands.common import add_connection_options, call, cell, print_json, table
from portal.commands.workloads import devices
from portal.waits import duration, eta_words, why_and_when

if TYPE_CHECKING:
    from portal.api.jobs import AttemptOut, JobOut
    from portal.client import Portal

HEADERS = ("ID", "TENANT", "OWNER", "NAME", "STATE", "MEMBERS", "ATTEMPT", "RESTARTS", "REASON")
ATTEMPT_HEADERS = (
    "#",
    "QUEUED",
    "STARTED",
    "ENDED",
    "WAIT",
    "NODES",
    "WORLD",
    "EXIT",
    "COUNTED",
    "RESUME",
)
COST_HEADERS = ("#", "EXIT", "GPU-HOURS", "COST")


def register(commands: Any) -> None:
    """Add ``jobs`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "jobs",
        help="list training jobs; submit one, show it, follow its logs, cancel it",
        description="Without an action: list the jobs the token may read, oldest first.",
    )
    parser.add_argument("--tenant", help="only this tenant")
    parser.add_argument("--state", choices=[s.value for s in JobState], help="only this state")
    add_connection_options(parser)
    parser.set_defaults(handler=list_jobs)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    sub = actions.add_parser(
        "submit",
        help="submit a job: MEMBERS ranks started all-or-nothing, restarted on failure",
        description=(
            "Submit a job charged to TENANT running the program after -- (gpuportal jobs "
            "submit team-a H100-80GB --members 2 -- python train.py) as --members ranks, "
            "each with --count GPUs of FLAVOR (or one MIG instance, or a --milli share). "
            "Prints the job: queued with its reason, position and ETA, or placed. With "
            "--follow, prints rank 0's log until the job ends and exits 0 only if it succeeded."
        ),
    )
    sub.add_argument("tenant", help="the tenant charged (you must be a member)")
    sub.add_argument("flavor", help="H100-80GB, H100-80GB/3g.40gb, T4/share, ...")
    sub.add_argument("--members", type=int, default=1, help="ranks (default 1); elastic: min")
    sub.add_argument(
        "--max-members",
        type=int,
        default=None,
        help="an elastic job: grows from --members up to this many as capacity frees",
    )
    sub.add_argument("--count", type=int, default=1, help="whole GPUs per member (default 1)")
    sub.add_argument("--milli", type=int, default=0, help="share of one GPU, 1..999 (share)")
    sub.add_argument("--name", default=None, help="a name for people (default: the program)")
    sub.add_argument("--cwd", default=None, help="working directory (absolute)")
    sub.add_argument("--image", default=None, help="container image (Kubernetes backend)")
    sub.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="repeatable")
    sub.add_argument("--checkpoint-dir", default=None, help="where checkpoints go (absolute)")
    sub.add_argument(
        "--topology",
        choices=[t.value for t in TopologyRequirement],
        default="any",
        help="how tightly the gang is placed",
    )
    sub.add_argument(
        "--topology-mode",
        choices=[m.value for m in TopologyMode],
        default="required",
        help="required: wait for it; preferred: relax to any",
    )
    sub.add_argument("--max-restarts", type=int, default=3, help="failures retried")
    sub.add_argument("--backoff", type=float, default=10.0, help="first restart delay, s")
    sub.add_argument("--backoff-cap", type=float, default=300.0, help="longest delay, s")
    sub.add_argument(
        "--fail-on-exit-code",
        type=int,
        action="append",
        default=[],
        metavar="CODE",
        help="end the job at once on this exit code (repeatable)",
    )
    sub.add_argument("--priority", type=int, default=0, help="higher goes first in the tenant")
    sub.add_argument("--follow", action="store_true", help="print rank 0's log until it ends")
    add_connection_options(sub, nested=True)
    # The program comes after ``--`` (split off by ``portal.cli.run``).
    sub.set_defaults(handler=submit_job, program=[])

    for name, handler, text in (
        ("show", show_job, "one job, ended ones included"),
        ("cancel", cancel_job, "stop its members and release its devices (idempotent)"),
        ("attempts", list_attempts, "every attempt: when, where, why it ended"),
        ("cost", show_cost, "GPU-hours and money of the job and of each attempt"),
    ):
        cmd = actions.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        cmd.add_argument("job_id", metavar="ID", help="the job's id")
        add_connection_options(cmd, nested=True)
        cmd.set_defaults(handler=handler)

    logs = actions.add_parser(
        "logs",
        help="a member's log; --follow keeps printing, across restarts, until the job ends",
        description="Print a member's log (rank 0 of the current attempt by default).",
    )
    logs.add_argument("job_id", metavar="ID", help="the job's id")
    logs.add_argument("--rank", type=int, default=0, help="the member (default 0)")
    logs.add_argument("--attempt", type=int, default=None, help="default: the current one")
    logs.add_argument("-f", "--follow", action="store_true", help="keep printing as it grows")
    add_connection_options(logs, nested=True)
    logs.set_defaults(handler=show_logs)


def _env(pairs: list[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise InvalidRequest("--env", repr(pair), "NAME=VALUE")
        out[name] = value
    return out


def members_words(j: JobOut) -> str:
    """``2`` for a fixed job; ``3 (2-4)`` for an elastic one: now, and its bound."""
    if j.max_members is None:
        return str(j.members)
    return f"{j.members_now} ({j.members}-{j.max_members})"


def describe(j: JobOut) -> str:
    pairs: list[tuple[str, object]] = [
        ("id", j.id),
        ("tenant", j.tenant),
        ("owner", j.owner),
        ("name", j.name),
        ("state", j.state.value),
        ("members", members_words(j)),
        ("attempt", j.attempt),
        ("restarts", f"{j.restarts} (preempted {j.preemptions})"),
    ]
    if j.reason:
        pairs.append(("reason", j.reason))
    pairs.append(("message", j.message))
    if j.topology_relaxed:
        pairs.append(("topology", "relaxed to any"))
    w = j.workload
    if w is not None and w.state.value == "queued":
        pairs.append(("waiting", f"{w.reason}: {why_and_when(w.message, w.eta_s)}"))
        if w.position is not None:
            pairs.append(("position", f"{w.position} ({w.tenant_position} in {w.tenant})"))
            pairs.append(("eta", eta_words(w.eta_s, w.eta_low_s, w.eta_high_s)))
            if w.eta_reason:
                pairs.append(("why", w.eta_reason))
    if w is not None and w.allocations:
        pairs.append(("devices", devices(w.allocations)))
    if j.next_start_at is not None:
        pairs.append(("next attempt", j.next_start_at))
    pairs += [("created", j.created_at), ("ended", j.ended_at)]
    width = max(len(k) for k, _ in pairs)
    return "\n".join(f"{k.ljust(width)}  {cell(v)}" for k, v in pairs)


def _print_one(args: argparse.Namespace, j: JobOut) -> int:
    if args.json:
        print_json(j)
    else:
        print(describe(j))
    return 0


def list_jobs(args: argparse.Namespace) -> int:
    found = call(args, lambda p: [job.info for job in p.jobs.list(args.tenant, args.state)])
    if args.json:
        print_json(found)
        return 0
    rows = [
        (
            j.id,
            j.tenant,
            j.owner,
            j.name,
            j.state.value,
            members_words(j),
            j.attempt,
            j.restarts,
            j.reason or None,
        )
        for j in found
    ]
    print(table(HEADERS, rows))
    return 0


def submit_job(args: argparse.Namespace) -> int:
    command = list(args.program)

    def go(portal: Portal) -> tuple[JobOut, int]:
        job = portal.jobs.submit(
            args.tenant,
            command,
            members=args.members,
            max_members=args.max_members,
            flavor=args.flavor,
            count=args.count,
            milli=args.milli,
            name=args.name,
            cwd=args.cwd,
            image=args.image,
            env=_env(args.env),
            checkpoint_dir=args.checkpoint_dir,
            topology=args.topology,
            topology_mode=args.topology_mode,
            max_restarts=args.max_restarts,
            backoff_s=args.backoff,
            backoff_cap_s=args.backoff_cap,
            fail_on_exit_codes=args.fail_on_exit_code,
            priority=args.priority,
        )
        if not args.follow:
            return job.info, 0
        print(describe(job.info), file=sys.stderr)
        for chunk in job.logs(follow=True):
            sys.stdout.write(chunk)
            sys.stdout.flush()
        end = job.wait()
        return end, 0 if end.state is JobState.SUCCEEDED else 1

    info: JobOut
    code: int
    info, code = call(args, go)
    if args.follow:
        print(f"job {info.id}: {info.state.value} ({info.message})", file=sys.stderr)
        return code
    _print_one(args, info)
    return code


def show_job(args: argparse.Namespace) -> int:
    return _print_one(args, call(args, lambda p: p.jobs.get(args.job_id).info))


def cancel_job(args: argparse.Namespace) -> int:
    return _print_one(args, call(args, lambda p: p.jobs.cancel(args.job_id)))


def _attempt_row(a: AttemptOut) -> tuple[object, ...]:
    resume = None if a.resume_step is None else f"step {a.resume_step}"
    return (
        a.number,
        a.queued_at,
        a.started_at,
        a.ended_at,
        None if a.queue_wait_s is None else duration(a.queue_wait_s),
        ",".join(a.nodes) or None,
        a.world_size,
        a.exit_reason or None,
        a.counted,
        resume,
    )


def list_attempts(args: argparse.Namespace) -> int:
    found = call(args, lambda p: p.jobs.attempts(args.job_id))
    if args.json:
        print_json(found)
        return 0
    print(table(ATTEMPT_HEADERS, [_attempt_row(a) for a in found]))
    return 0


def show_cost(args: argparse.Namespace) -> int:
    found = call(args, lambda p: p.jobs.cost(args.job_id))
    if args.json:
        print_json(found)
        return 0
    rows = [
        (a.number, a.exit_reason or "running", f"{a.gpu_hours:.2f}", f"{a.cost} {found.currency}")
        for a in found.attempts
    ]
    rows.append(("all", "", f"{found.gpu_hours:.2f}", f"{found.cost} {found.currency}"))
    print(table(COST_HEADERS, rows))
    if found.unpriced_models:
        print(f"no price configured for {', '.join(found.unpriced_models)}: counted at 0")
    return 0


def show_logs(args: argparse.Namespace) -> int:
    def go(portal: Portal) -> None:
        job = portal.jobs.get(args.job_id)
        for chunk in job.logs(rank=args.rank, attempt=args.attempt, follow=args.follow):
            sys.stdout.write(chunk)
            sys.stdout.flush()

    call(args, go)
    return 0
