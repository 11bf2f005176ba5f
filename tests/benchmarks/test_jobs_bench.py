"""Smoke test of ``python -m benchmarks.jobs`` at the policy level: it runs, admits every job
and reports a rate (the Kubernetes path needs the control plane and minutes: not here)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from benchmarks import jobs


def test_the_policy_level_admits_every_job_and_reports_a_rate(tmp_path: Path) -> None:
    out = tmp_path / "jobs.json"
    assert jobs.main(["--policy-only", "--policy-jobs", "60", "--json", str(out)]) == 0
    result = json.loads(out.read_text())["policy"]
    assert result["jobs"] == 60 and result["admitted"] == 60
    assert result["per_s"] > 0 and result["seconds"] > 0


def test_the_shape_is_kueues() -> None:
    assert len(jobs.tenants()) == 30 and len({c for _, c in jobs.tenants()}) == 5
    by_name = {c.name: c for c in jobs.CLASSES}
    assert [(c.count, c.members * c.gpus, c.runtime_ms, c.every_ms) for c in by_name.values()] == [
        (350, 1, 200, 100),
        (100, 5, 500, 500),
        (50, 20, 1000, 1200),
    ]


def test_a_loop_round_behind_a_queue_is_timed(tmp_path: Path) -> None:
    out = tmp_path / "jobs.json"
    # 200 jobs of the three classes ask for ~1,700 GPUs: on Kueue's 600 some wait.
    argv = ["--policy-only", "--policy-jobs", "6", "--queued", "200", "--json", str(out)]
    assert jobs.main(argv) == 0
    result = json.loads(out.read_text())["queued_round"]
    assert result["jobs"] == 200 and 0 < result["queued"] < 200
    assert len(result["rounds_s"]) == 3 and result["round_s"] in result["rounds_s"]


def test_the_portals_calls_are_counted_by_kind() -> None:
    """The count wraps the pinned client's own ``call_api`` (method, url): a real request,
    refused by a closed loopback port, is counted under its templated kind."""
    from kubernetes import client

    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    config = client.Configuration()
    config.host = f"http://127.0.0.1:{port}"
    config.retries = False
    with client.ApiClient(config) as api:
        calls = jobs._count_calls(api)
        with pytest.raises(Exception, match=r"(?i)connect|refused"):
            client.CoreV1Api(api).read_namespaced_pod("p-1", "team-a", _request_timeout=2)
    assert calls == {"GET /api/v1/namespaces/{namespace}/pods/{name}": 1}
