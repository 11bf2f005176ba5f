"""GPU telemetry: the ingest wire format, storage with roll-ups and retention, and reads."""
