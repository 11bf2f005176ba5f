"""The dashboards read the Python client's records as it returns them: one definition of each
record (the API's answer models), no parallel dataclass filled field by field."""

from __future__ import annotations

import typing
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel

from dashboards.sources import NodeChanges, Source
from portal.client import Portal as Client
from tests.dashboards.conftest import Portal


def _classes(hint: object) -> set[type]:
    """The classes a return annotation names, inside lists, dicts and unions."""
    args = typing.get_args(hint)
    if args:
        return set().union(*(_classes(a) for a in args))
    return {hint} if isinstance(hint, type) else set()


def test_every_record_the_source_returns_is_the_clients_own() -> None:
    returned: set[type] = set()
    for name in dir(Source):
        method = getattr(Source, name)
        if name.startswith("_") or not callable(method):
            continue
        returned |= _classes(typing.get_type_hints(method).get("return"))
    returned |= _classes(typing.get_type_hints(NodeChanges)["nodes"])
    records = {t for t in returned if t.__module__ not in ("builtins", "datetime")}
    assert records - {NodeChanges}, "the Source returns no records at all"
    not_the_clients = {
        f"{t.__module__}.{t.__qualname__}"
        for t in records - {NodeChanges}
        if not (issubclass(t, BaseModel) and t.__module__.startswith("portal.api."))
    }
    assert not_the_clients == set()


def test_the_source_answers_what_the_client_answers(portal: Portal) -> None:
    source = portal.source("tok-root")
    client = Client(portal.url, "tok-root")
    now = portal.clock.now
    start = (now - timedelta(hours=1)).timestamp()
    try:
        assert source.workloads() == client.workloads()
        assert source.node_changes(None).nodes == client.nodes()
        node = client.nodes()[0].name
        assert source.node(node) == client.node(node)
        assert source.alerts() == client.alerts(states=("pending", "firing"))
        assert source.budgets() == client.budgets()
        month = datetime(now.year, now.month, 1, tzinfo=UTC)
        assert source.cost(["tenant"], start=month, end=now) == client.cost(
            start=month, end=now, step="whole", group_by=["tenant"]
        )
        devices = client.device_usage(start=start, end=now.timestamp()).devices
        assert source.device_usage(start=start, end=now.timestamp()) == devices
    finally:
        client.close()
