"""The webhook against a real local HTTP server, and the Prometheus collector."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from policies.alerts import Alert, AlertKey, AlertState, Transition
from portal.alerting.metrics import AlertCollector
from portal.alerting.store import AlertStore
from portal.alerting.webhook import WebhookAction
from portal.api.metrics import ServiceMetrics
from tests.portal.telemetry.conftest import make_portal


@dataclass
class Receiver:
    """A real HTTP server: answers each POST with the next status of ``script`` (then 200),
    sleeping ``delay_s`` first; records every body."""

    script: list[int] = field(default_factory=list)
    delay_s: float = 0.0
    bodies: list[dict[str, object]] = field(default_factory=list)
    url: str = ""


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    rec = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            rec.bodies.append(body)
            time.sleep(rec.delay_s)
            status = rec.script.pop(0) if rec.script else 200
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, fmt: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield rec
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)


def transition(state: AlertState, previous: AlertState | None, rule: str = "idle") -> Transition:
    alert = Alert(
        key=AlertKey(rule, "GPU-n1-0", "w1"),
        state=state,
        tenant="team-a",
        owner="alice",
        workloads=("w1",),
        summary="w1 uses 1.0 % of GPU-n1-0",
        value=1.0,
        active_since=100.0,
        fired_at=None if state is AlertState.PENDING else 160.0,
    )
    return Transition(previous, alert, 160.0)


def test_firing_and_resolved_alerts_are_posted_and_pending_ones_are_not(
    receiver: Receiver,
) -> None:
    hook = WebhookAction(receiver.url, backoff_s=0.01)
    hook(
        [
            transition(AlertState.PENDING, None),
            transition(AlertState.FIRING, AlertState.PENDING),
            transition(AlertState.RESOLVED, AlertState.FIRING, rule="xid"),
        ],
        now=160.0,
    )
    hook.close()
    assert [(b["rule"], b["state"], b["previous"]) for b in receiver.bodies] == [
        ("idle", "firing", "pending"),
        ("xid", "resolved", "firing"),
    ]
    assert receiver.bodies[0]["workloads"] == ["w1"] and receiver.bodies[0]["owner"] == "alice"
    assert hook.delivered == 2 and hook.failed == 0


def test_server_errors_are_retried_and_client_errors_are_not(receiver: Receiver) -> None:
    receiver.script = [503, 500, 200, 404]
    hook = WebhookAction(receiver.url, retries=3, backoff_s=0.01)
    hook([transition(AlertState.FIRING, AlertState.PENDING)], now=160.0)
    assert len(receiver.bodies) == 3 and hook.delivered == 1  # two failures, then delivered
    hook([transition(AlertState.FIRING, AlertState.PENDING)], now=160.0)
    assert len(receiver.bodies) == 4 and hook.failed == 1  # 404: not retried
    hook.close()


def test_a_hanging_webhook_times_out_retries_and_gives_up_without_raising(
    receiver: Receiver,
) -> None:
    receiver.delay_s = 1.0
    hook = WebhookAction(receiver.url, timeout_s=0.2, retries=1, backoff_s=0.01)
    started = time.monotonic()
    hook([transition(AlertState.FIRING, AlertState.PENDING)], now=160.0)
    assert time.monotonic() - started < 1.5  # two attempts of 0.2 s, not two of 1 s
    assert hook.failed == 1 and len(receiver.bodies) == 2
    hook.close()


def test_nothing_listening_is_a_logged_failure() -> None:
    hook = WebhookAction("http://127.0.0.1:9/nothing", retries=1, backoff_s=0.01)
    hook([transition(AlertState.FIRING, AlertState.PENDING)], now=160.0)
    assert hook.failed == 1
    hook.close()


def test_the_collector_counts_active_alerts_by_rule_state_and_tenant() -> None:
    alerts = [
        transition(AlertState.FIRING, None).alert,
        transition(AlertState.PENDING, None).alert,
        transition(AlertState.FIRING, None, rule="xid").alert,
        transition(AlertState.RESOLVED, None).alert,
    ]
    registry = CollectorRegistry()
    registry.register(AlertCollector(lambda: alerts))
    text = generate_latest(registry).decode()
    assert 'gpuportal_alerts{rule="idle",state="firing",tenant="team-a"} 1.0' in text
    assert 'gpuportal_alerts{rule="idle",state="pending",tenant="team-a"} 1.0' in text
    assert 'gpuportal_alerts{rule="xid",state="firing",tenant="team-a"} 1.0' in text
    assert "resolved" not in text


def test_the_service_metrics_include_the_stored_active_alerts(tmp_path: Path) -> None:
    p = make_portal(f"sqlite:///{tmp_path / 'portal.db'}")
    try:
        AlertStore(p.store.engine).save(
            [
                transition(AlertState.FIRING, AlertState.PENDING).alert,
                transition(AlertState.RESOLVED, AlertState.FIRING, rule="xid").alert,
            ]
        )
        text = ServiceMetrics(p.alloc).exposition().decode()
    finally:
        p.store.close()
    assert 'gpuportal_alerts{rule="idle",state="firing",tenant="team-a"} 1.0' in text
    assert 'rule="xid"' not in text
