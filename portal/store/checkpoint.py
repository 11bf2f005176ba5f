"""SQLite WAL checkpoints, run in the background so no commit waits for one."""

from __future__ import annotations

import logging
import threading

from sqlalchemy import Engine

log = logging.getLogger(__name__)


class Checkpointer:
    """Runs SQLite WAL checkpoints in a daemon thread (automatic ones are off, see ``db``).

    PASSIVE checkpoints never block writers; the WAL is bounded by running one every
    ``interval_s`` seconds.
    """

    def __init__(self, engine: Engine, interval_s: float = 0.5) -> None:
        self._engine = engine
        self._interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sqlite-checkpointer", daemon=True)

    @classmethod
    def start_for(cls, engine: Engine) -> Checkpointer | None:
        if engine.dialect.name != "sqlite" or engine.url.database in (None, "", ":memory:"):
            return None
        cp = cls(engine)
        cp._thread.start()
        return cp

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.checkpoint()
        self.checkpoint()

    def checkpoint(self) -> None:
        try:
            with self._engine.connect() as conn:
                conn.exec_driver_sql("PRAGMA wal_checkpoint(PASSIVE)")
        except Exception:  # a failed checkpoint is retried next time; never fatal
            log.warning("SQLite checkpoint failed", exc_info=True)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
