"""What every API subcommand shares: the connection options, the client, and output.

Subcommands print aligned tables for people and, with ``--json``, stable JSON for scripts (keys
sorted, the API's field names, the same order as the table). The client is imported on use, so
``gpuportal version`` does not load httpx.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import BaseModel

    from portal.client import Portal

Row = Sequence[object]


def add_connection_options(parser: argparse.ArgumentParser, *, nested: bool = False) -> None:
    """``--url``, ``--token`` and ``--json``.

    ``nested``: the parser is an action under a noun that has them already (``quotas set``);
    there they default to SUPPRESS so the noun's value is not overwritten when not given.
    """

    def default(value: object) -> object:
        return argparse.SUPPRESS if nested else value

    parser.add_argument(
        "--url",
        default=default(None),
        help="the portal's URL (default: GPUPORTAL_URL, else derived from JUPYTERHUB_API_URL)",
    )
    parser.add_argument(
        "--token",
        default=default(None),
        help="API token (default: JUPYTERHUB_API_TOKEN, else JPY_API_TOKEN; prefer those: "
        "arguments are visible to other users of the machine)",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        default=default(False),
        help="print JSON for scripts instead of a table",
    )


def connect(args: argparse.Namespace) -> Portal:
    from portal.client import Portal

    return Portal(args.url, args.token)


def call(args: argparse.Namespace, action: Callable[[Portal], Any]) -> Any:
    """Run ``action`` with a client for ``args``, closing it afterwards."""
    with connect(args) as portal:
        return action(portal)


def print_json(value: BaseModel | Sequence[BaseModel] | dict[str, Any]) -> None:
    if isinstance(value, dict):
        data: Any = value
    elif isinstance(value, Sequence):
        data = [item.model_dump(mode="json") for item in value]
    else:
        data = value.model_dump(mode="json")
    print(json.dumps(data, indent=2, sort_keys=True))


def table(headers: Sequence[str], rows: Iterable[Row], *, empty: str = "(none)") -> str:
    """Columns aligned; numbers right-aligned, text left-aligned; ``None`` shown as ``-``."""
    values = [list(row) for row in rows]
    if not values:
        return empty
    numeric = [
        all(_is_number(row[i]) for row in values) and any(row[i] is not None for row in values)
        for i in range(len(headers))
    ]
    cells = [[cell(v) for v in row] for row in values]
    widths = [max(len(h), *(len(row[i]) for row in cells)) for i, h in enumerate(headers)]

    def line(texts: Sequence[str]) -> str:
        parts = [
            t.rjust(w) if num else t.ljust(w)
            for t, w, num in zip(texts, widths, numeric, strict=True)
        ]
        return "  ".join(parts).rstrip()

    return "\n".join([line(headers), *(line(row) for row in cells)])


def _is_number(value: object) -> bool:
    return value is None or (isinstance(value, int | float) and not isinstance(value, bool))


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:g}" if value != int(value) else str(int(value))
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S")
    return str(value)


def unit_of(flavor: str) -> str:
    """The unit a flavor's quota counts in (gpus, instances, milli-gpu), by the portal's rule."""
    from policies.errors import InvalidRequest
    from policies.flavors import Flavor

    try:
        return Flavor.parse(flavor).unit
    except InvalidRequest:
        return "?"
