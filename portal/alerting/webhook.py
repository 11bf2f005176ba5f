"""The webhook action: POST each alert that fires or resolves as JSON to a configured URL.

Body (one alert per request)::

    {"id": "...", "rule": "idle", "state": "firing", "previous": "pending", "at": 1793611860.0,
     "scope": "GPU-...", "subject": "<workload>", "tenant": "team-a", "owner": "alice",
     "workloads": ["<workload>"], "summary": "...", "value": 1.5,
     "active_since": ..., "fired_at": ..., "resolved_at": null}

A request that times out, cannot connect, or gets a 5xx or 429 answer is retried ``retries``
times with a doubling pause; any other answer is final. A webhook that stays down is logged,
never raised: the alert is already stored and listed by the API.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import httpx

from policies.alerts import AlertState, Transition
from portal.alerting.store import alert_id

log = logging.getLogger(__name__)

NOTIFIED = frozenset({AlertState.FIRING, AlertState.RESOLVED})


def payload(t: Transition) -> dict[str, object]:
    a = t.alert
    return {
        "id": alert_id(a.key, a.active_since),
        "rule": a.key.rule,
        "state": a.state.value,
        "previous": None if t.previous is None else t.previous.value,
        "at": t.at,
        "scope": a.key.scope,
        "subject": a.key.subject,
        "tenant": a.tenant,
        "owner": a.owner,
        "workloads": list(a.workloads),
        "summary": a.summary,
        "value": a.value,
        "active_since": a.active_since,
        "fired_at": a.fired_at,
        "resolved_at": a.resolved_at,
    }


class WebhookAction:
    """POSTs firing and resolved alerts to ``url``.

    Args:
        url: where to POST.
        timeout_s: per attempt.
        retries: further attempts after a failed one.
        backoff_s: pause before the first retry, doubled for each next one.
        headers: sent with every request (e.g. an ``Authorization``).
    """

    def __init__(
        self,
        url: str,
        *,
        timeout_s: float = 5.0,
        retries: int = 3,
        backoff_s: float = 1.0,
        headers: dict[str, str] | None = None,
        client: httpx.Client | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.url = url
        self.retries = retries
        self.backoff_s = backoff_s
        self._client = client or httpx.Client(timeout=timeout_s, headers=headers)
        self._sleep = sleep
        self.delivered = 0
        self.failed = 0

    def __call__(self, transitions: Sequence[Transition], now: float) -> None:
        for t in transitions:
            if t.alert.state in NOTIFIED:
                if self._post(payload(t)):
                    self.delivered += 1
                else:
                    self.failed += 1

    def _post(self, body: dict[str, object]) -> bool:
        pause = self.backoff_s
        for attempt in range(self.retries + 1):
            try:
                r = self._client.post(self.url, json=body)
                if r.status_code < 300:
                    return True
                if r.status_code < 500 and r.status_code != 429:
                    log.warning(
                        "webhook %s refused alert %s: %s", self.url, body["id"], r.status_code
                    )
                    return False
                why = f"HTTP {r.status_code}"
            except httpx.HTTPError as exc:
                why = f"{type(exc).__name__}: {exc}"
            if attempt < self.retries:
                self._sleep(pause)
                pause *= 2
        log.warning(
            "webhook %s failed for alert %s after %d attempts (%s)",
            self.url,
            body["id"],
            self.retries + 1,
            why,
        )
        return False

    def close(self) -> None:
        self._client.close()
