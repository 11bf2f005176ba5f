"""``gpuportal cost`` (summary) and its actions ``chargeback`` (CSV) and ``budgets``."""

from __future__ import annotations

import argparse
from datetime import datetime
from typing import TYPE_CHECKING, Any

from policies.errors import InvalidRequest
from portal.commands.common import add_connection_options, call, print_json, table

if TYPE_CHECKING:
    from portal.api.cost import CostGroupOut

KEY_HEADERS = {"tenant": "TENANT", "owner": "OWNER", "flavor": "FLAVOR", "period": "PERIOD"}


def register(commands: Any) -> None:
    """Add ``cost`` to the CLI's subcommands (an argparse ``_SubParsersAction``)."""
    parser = commands.add_parser(
        "cost",
        help="GPU-hours and cost by tenant, owner, flavor, period; chargeback CSV; budgets",
        description=(
            "Without an action: GPU-hours held, GPU-hours used (with utilization data), "
            "efficiency, cost and idle cost in a window (default: this month, UTC, until now), "
            "grouped by tenant unless --by says otherwise. Needs scope cost:read."
        ),
    )
    _window_options(parser)
    parser.add_argument(
        "--by",
        action="append",
        default=None,
        metavar="KEY",
        help="group by tenant, owner, flavor or period (repeat for several; default tenant)",
    )
    add_connection_options(parser)
    parser.set_defaults(handler=show_cost)
    actions = parser.add_subparsers(dest="action", metavar="ACTION")

    chargeback = actions.add_parser(
        "chargeback",
        help="the chargeback CSV on stdout: one row per period, tenant, owner and flavor",
        description="Print the chargeback CSV (periods: --step, default day).",
    )
    _window_options(chargeback, nested=True)
    add_connection_options(chargeback, nested=True)
    chargeback.set_defaults(handler=print_chargeback)

    budgets = actions.add_parser(
        "budgets",
        help="this month's budgets: spent, burn rate, projection",
        description="Budgets of this month with spend so far, burn per hour and projection.",
    )
    budgets.add_argument("--tenant", default=argparse.SUPPRESS, help="only this tenant")
    add_connection_options(budgets, nested=True)
    budgets.set_defaults(handler=show_budgets)


def _window_options(parser: argparse.ArgumentParser, *, nested: bool = False) -> None:
    def default(value: object) -> object:
        return argparse.SUPPRESS if nested else value

    parser.add_argument("--start", default=default(None), help="window start, ISO 8601 (UTC)")
    parser.add_argument("--end", default=default(None), help="window end, exclusive (UTC)")
    parser.add_argument("--step", default=default(None), help="periods: whole, day or month")
    parser.add_argument("--tenant", default=default(None), help="only this tenant")


def _when(option: str, text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise InvalidRequest(
            option, repr(text), "an ISO 8601 time, e.g. 2026-11-01 or 2026-11-01T08:00Z"
        ) from None


def show_cost(args: argparse.Namespace) -> int:
    summary = call(
        args,
        lambda p: p.cost(
            start=_when("--start", args.start),
            end=_when("--end", args.end),
            step=args.step,
            group_by=args.by or (),
            tenant=args.tenant,
        ),
    )
    if args.json:
        print_json(summary)
        return 0
    keys = [str(k) for k in summary.group_by]
    headers = [KEY_HEADERS.get(k, k.upper()) for k in keys]
    headers += ["GPU-H", "USED GPU-H", "EFFICIENCY", f"COST {summary.currency}", "IDLE COST"]

    def row(label: list[object], g: CostGroupOut) -> list[object]:
        efficiency = None if g.efficiency is None else f"{g.efficiency:.0%}"
        hours = [round(g.allocated_gpu_hours, 2), _hours(g.used_gpu_hours), efficiency]
        return [*label, *hours, g.cost, g.idle_cost]

    rows = [row([_key(g, k) for k in keys], g) for g in summary.groups]
    rows.append(row(["TOTAL", *[""] * (len(keys) - 1)], summary.total))
    print(f"{summary.start:%Y-%m-%d %H:%M} .. {summary.end:%Y-%m-%d %H:%M} UTC")
    if summary.unpriced_models:
        print(f"no price for {', '.join(summary.unpriced_models)}: counted at 0")
    print(table(headers, rows))
    return 0


def _hours(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


def _key(g: CostGroupOut, key: str) -> object:
    if key == "period":
        return None if g.period_start is None else f"{g.period_start:%Y-%m-%d}"
    return getattr(g, key, None)


def print_chargeback(args: argparse.Namespace) -> int:
    text = call(
        args,
        lambda p: p.chargeback(
            start=_when("--start", args.start),
            end=_when("--end", args.end),
            step=args.step,
            tenant=args.tenant,
        ),
    )
    print(text, end="" if text.endswith("\n") else "\n")
    return 0


def show_budgets(args: argparse.Namespace) -> int:
    found = call(args, lambda p: p.budgets(args.tenant))
    budgets = sorted(found, key=lambda b: (b.tenant, b.flavor or "", b.kind))
    if args.json:
        print_json(budgets)
        return 0
    headers = ("TENANT", "FLAVOR", "KIND", "BUDGET", "SPENT", "BURN/H", "PROJECTED", "OVER")
    rows = [
        (
            *(b.tenant, b.flavor, b.kind, b.budget, round(b.spent, 2)),
            *(round(b.burn_per_hour, 3), round(b.projected, 2), b.over, b.exhausted_at),
        )
        for b in budgets
    ]
    print(table((*headers, "RUNS OUT"), rows))
    return 0
