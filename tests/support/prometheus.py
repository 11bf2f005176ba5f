"""A real Prometheus server (Debian's ``prometheus`` package) for tests, on loopback.

``running_prometheus(work_dir, targets)`` writes a config scraping ``targets`` every second
(``honor_labels: true``, as the GPU operator's ServiceMonitor for the DCGM exporter sets it),
starts the server in its own process group with storage under ``work_dir``, waits until it is
ready, and stops it (SIGTERM, then SIGKILL) when the block ends.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import yaml

from tests.support.ports import free_port

READY_TIMEOUT_S = 60.0


def _ready(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/-/ready", timeout=2) as response:
            return int(response.status) == 200
    except (urllib.error.URLError, OSError):
        return False


@contextmanager
def running_prometheus(
    work_dir: Path, targets: Sequence[str], *, scrape_interval: str = "1s"
) -> Iterator[str]:
    """Yields the server's base URL, e.g. ``http://127.0.0.1:40123``."""
    binary = shutil.which("prometheus")
    if binary is None:
        raise RuntimeError(
            "prometheus not found; install the Debian package (scripts/bootstrap test)"
        )
    config = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": scrape_interval},
        "scrape_configs": [
            {
                "job_name": "dcgm-exporter",
                "honor_labels": True,
                "static_configs": [{"targets": list(targets)}],
            }
        ],
    }
    work_dir.mkdir(parents=True, exist_ok=True)
    config_path = work_dir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = work_dir / "prometheus.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={work_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                "--log.level=warn",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not _ready(url):
            if process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"prometheus did not become ready (exit {process.poll()}):\n"
                    + log_path.read_text()[-2000:]
                )
            time.sleep(0.2)
        yield url
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
