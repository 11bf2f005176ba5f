"""Sends sample batches to the portal API, holding them while the portal is unreachable.

``POST /api/v1/telemetry/samples`` with ``Authorization: token <token>``. Batches wait in a
bounded buffer, oldest sent first; when the buffer is full the oldest batch is dropped (the
newest samples are worth more than old ones), counted in ``dropped``. A portal outage never
raises: transport errors and every answer but success keep the batch and wait with
exponential backoff (1 s doubling to 60 s) before the next attempt (a 401/403 or 404 is a
token or URL being fixed); only 400, 413 and 422, which say the batch itself is unacceptable,
drop that batch, since resending it cannot help. Samples the portal takes the batch but
rejects (an unknown GPU, a time out of range) are logged from its ``IngestResult``.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httpx
from pydantic import ValidationError

from portal.telemetry.wire import IngestResult, SampleBatch

log = logging.getLogger(__name__)

INGEST_PATH = "/api/v1/telemetry/samples"
_REFUSED = frozenset({400, 413, 422})


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delays between failed attempts: ``first`` seconds, times ``factor``, at most ``cap``."""

    first: float = 1.0
    factor: float = 2.0
    cap: float = 60.0

    def delay(self, failures: int) -> float:
        return 0.0 if failures <= 0 else min(self.cap, self.first * self.factor ** (failures - 1))


@dataclass
class ReporterStats:
    sent: int = 0  # batches the portal took
    dropped: int = 0  # batches dropped (buffer full, or refused as malformed)
    failures: int = 0  # failed attempts since the last success
    last_error: str = ""
    last_result: IngestResult | None = None


class Reporter:
    """A bounded buffer of batches and the client that delivers them.

    ``client`` is an ``httpx.Client`` whose ``base_url`` is the portal's (with any service
    prefix); the reporter does not close it.
    """

    def __init__(
        self,
        client: httpx.Client,
        token: str,
        *,
        max_batches: int = 360,
        backoff: Backoff | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_batches < 1:
            raise ValueError(f"max_batches must be >= 1, got {max_batches}")
        self._client = client
        self._headers = {"Authorization": f"token {token}"}
        self._buffer: deque[SampleBatch] = deque()
        self._max = max_batches
        self._backoff = backoff or Backoff()
        self._clock = clock
        self._next_try = 0.0
        self.stats = ReporterStats()

    @property
    def pending(self) -> int:
        return len(self._buffer)

    @property
    def queued(self) -> tuple[SampleBatch, ...]:
        """The batches waiting, oldest first."""
        return tuple(self._buffer)

    def submit(self, batch: SampleBatch) -> None:
        """Queue a batch; drops the oldest when the buffer is full."""
        if len(self._buffer) >= self._max:
            self._buffer.popleft()
            self.stats.dropped += 1
        self._buffer.append(batch)

    def flush(self, limit: int | None = None) -> bool:
        """Send queued batches, oldest first, until one fails, none is left or ``limit`` were
        sent (a long backlog drains over several rounds instead of delaying the sampling).

        Returns whether the buffer is empty. Does nothing while backing off after a failure.
        """
        if self._clock() < self._next_try:
            return not self._buffer
        sent = 0
        while self._buffer and (limit is None or sent < limit):
            if not self._send(self._buffer[0]):
                self.stats.failures += 1
                self._next_try = self._clock() + self._backoff.delay(self.stats.failures)
                return False
            self._buffer.popleft()
            sent += 1
        return not self._buffer

    def _send(self, batch: SampleBatch) -> bool:
        """True when the batch is done with (taken, or refused for good)."""
        try:
            response = self._client.post(
                INGEST_PATH, content=batch.model_dump_json(), headers=self._headers | _JSON
            )
        except httpx.HTTPError as e:
            return self._failed(f"portal unreachable: {type(e).__name__}: {e}")
        if response.is_success:
            try:
                result = IngestResult.model_validate_json(response.content)
            except ValidationError:
                return self._failed(
                    f"{response.url} answered {response.status_code} but not "
                    "with an ingest result; is the portal URL right?"
                )
            self.stats.sent += 1
            self.stats.failures = 0
            self.stats.last_error = ""
            self.stats.last_result = result
            if result.rejected:
                log.warning(
                    "portal rejected %d of %d samples: %s",
                    result.rejected,
                    len(batch.samples),
                    "; ".join(r.reason for r in result.rejections[:3]),
                )
            return True
        detail = f"portal answered {response.status_code}: {response.text[:300]}"
        if response.status_code not in _REFUSED:
            return self._failed(detail)
        log.error("dropping a batch the portal refused as malformed (%s)", detail)
        self.stats.dropped += 1
        self.stats.last_error = detail
        return True

    def _failed(self, detail: str) -> bool:
        if detail != self.stats.last_error:
            log.warning("%s; keeping %d batch(es) and retrying", detail, len(self._buffer))
        self.stats.last_error = detail
        return False


_JSON = {"Content-Type": "application/json"}
